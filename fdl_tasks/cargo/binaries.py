"""Which binaries ``cargo build --bin NAME`` accepts in a crate directory.

``inv prebuild --cmd NAME`` builds with ``cd <crate dir> && cargo build --bin NAME``.
A misspelt name used to run preflight and every Docker build before cargo said
``no bin target named ...``; :func:`check_binary` refuses it first, in one line,
with the close matches.

The names come from the manifests: :mod:`fdl_tasks.cargo.cargo_workspace` picks the
packages cargo selects by default (``--bin`` without ``-p`` never searches the
whole workspace) and :mod:`fdl_tasks.cargo.cargo_manifest` reads each one's binaries;
both document the cargo behaviour they model. cargo itself answers ``no bin
target named `x` in default-run packages`` for a binary of another member; here
the refusal names that member's directory.

Files first, cargo only before refusing. Reading the manifests takes about a
millisecond (no subprocess) and works on Docker-mode controllers, which often
have no cargo; ``cargo metadata --no-deps --offline`` takes 0.1-0.5 s and needs
Rust installed on the controller, so it is not worth paying when the name is
found. It is asked only on the refusal path (when cargo is on ``PATH``): its
``workspace_default_members`` run from the crate directory are exactly the
selected packages, so a name it knows is accepted even if the manifest reading missed it
(TOML 1.1 syntax that ``tomllib`` rejects but a new cargo accepts, a cargo
feature modelled wrongly), and its list replaces the one from the files in
the message. When cargo is missing, fails (a member whose path dependency does not
exist makes ``cargo metadata`` fail too), times out or prints something
unexpected, the file reading decides alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from fdl_tasks.cargo.cargo_manifest import (
    MANIFEST,
    ManifestReader,
    Package,
    find_manifest,
    load_package,
    workspace_root,
)
from fdl_tasks.cargo.cargo_workspace import default_packages, selected_packages, workspace_members
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.suggest import close_matches, quoted_choice

__all__ = [
    "CARGO_TIMEOUT",
    "Package",
    "binary_names",
    "cargo_binary_names",
    "check_binary",
    "find_manifest",
    "selected_packages",
]

#: Seconds ``cargo metadata`` may take before the check goes on without it.
CARGO_TIMEOUT = 5.0

#: Binaries listed in a refusal before the rest are counted.
_LISTED = 12


# ---------------------------------------------------------------------------- public API


def binary_names(crate_dir: Path) -> frozenset[str]:
    """Every name ``cargo build --bin NAME`` accepts in ``crate_dir``, from the files alone.

    Raises :class:`FdlError` naming the file when a manifest the answer depends on is
    missing, unreadable or not valid TOML (``tomllib``: TOML 1.0).
    """
    return frozenset().union(*(p.bins for p in selected_packages(crate_dir)))


def cargo_binary_names(
    crate_dir: Path, *, cargo: str | None = None, timeout: float = CARGO_TIMEOUT
) -> frozenset[str] | None:
    """The same answer from ``cargo metadata --no-deps --format-version 1 --offline`` run
    in ``crate_dir``: bin targets of the packages in ``workspace_default_members``.

    ``None`` when cargo (``cargo``, else ``cargo`` on ``PATH``) is missing, fails, takes
    longer than ``timeout`` seconds, or prints something unexpected. rustup may not
    install a Rust release for it (``RUSTUP_AUTO_INSTALL=0``).
    """
    program = cargo or shutil.which("cargo")
    if program is None:
        return None
    argv = [program, "metadata", "--no-deps", "--format-version", "1", "--offline"]
    env = {**os.environ, "RUSTUP_AUTO_INSTALL": "0", "CARGO_TERM_COLOR": "never"}
    try:
        stdout = _run_bounded(argv, Path(crate_dir), env, timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return None if stdout is None else _metadata_bins(stdout)


def check_binary(
    command: str,
    crate_dir: Path,
    *,
    use_cargo: bool = True,
    cargo: str | None = None,
    timeout: float = CARGO_TIMEOUT,
) -> None:
    """Raise :class:`FdlError` unless ``cargo build --bin command`` can find that binary
    in ``crate_dir``; the message lists the close matches and the known binaries.

    The files answer first; before refusing, ``cargo metadata`` (when ``use_cargo`` and
    cargo can be run) gets the last word, see the module docstring.
    """
    reader = ManifestReader()
    try:
        manifest = find_manifest(crate_dir)
        selected = default_packages(reader, manifest)
    except FdlError:
        confirmed = _ask_cargo(use_cargo, crate_dir, cargo, timeout)
        if confirmed is None:
            raise
        if command in confirmed:
            return
        raise FdlError(_refusal(command, _location(crate_dir), confirmed, "")) from None
    names = frozenset().union(*(p.bins for p in selected))
    if command in names:
        return
    if (confirmed := _ask_cargo(use_cargo, crate_dir, cargo, timeout)) is not None:
        if command in confirmed:
            return
        names = confirmed
    hint = _elsewhere(reader, manifest, selected, command)
    raise FdlError(_refusal(command, _location(crate_dir, manifest), names, hint))


# ---------------------------------------------------------------------------- cargo metadata


def _ask_cargo(
    use_cargo: bool, crate_dir: Path, cargo: str | None, timeout: float
) -> frozenset[str] | None:
    return cargo_binary_names(crate_dir, cargo=cargo, timeout=timeout) if use_cargo else None


def _run_bounded(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> bytes | None:
    """stdout of a successful run, ``None`` on failure or timeout. The process gets its
    own group, killed whole on a timeout or an interrupt."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return stdout if process.returncode == 0 else None


def _metadata_bins(stdout: bytes) -> frozenset[str] | None:
    """Bin targets of the default members in ``cargo metadata`` JSON (cargo >= 1.71)."""
    try:
        document = json.loads(stdout)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    defaults = document.get("workspace_default_members")
    packages = document.get("packages")
    if not isinstance(defaults, list) or not isinstance(packages, list):
        return None
    names: set[str] = set()
    for package in packages:
        if not isinstance(package, dict) or package.get("id") not in defaults:
            continue
        for target in package.get("targets") or []:
            if isinstance(target, dict) and "bin" in (target.get("kind") or []):
                names.add(str(target.get("name")))
    return frozenset(names)


# ---------------------------------------------------------------------------- the refusal


def _location(crate_dir: Path, manifest: Path | None = None) -> str:
    """``<dir> (Cargo.toml)``: the crate directory, or the parent cargo found the manifest in."""
    shown = Path(crate_dir)
    if manifest is not None and manifest.parent != shown.resolve():
        shown = manifest.parent
    return f"{shown} ({MANIFEST})"


def _refusal(command: str, location: str, names: frozenset[str], hint: str) -> str:
    parts = [f"no binary {command!r} in {location}:"]
    if close := close_matches(command, names):
        parts.append(f"did you mean {quoted_choice(close)}?")
    if not (listed := sorted(names)):
        parts.append("it has no binary targets")
    else:
        more = len(listed) - _LISTED
        shown = ", ".join(listed[:_LISTED]) + (f", ... ({more} more)" if more > 0 else "")
        parts.append(f"binaries: {shown}")
    return " ".join(parts) + hint


def _elsewhere(
    reader: ManifestReader, manifest: Path, selected: tuple[Package, ...], command: str
) -> str:
    """``; 'x' is in <dir> (package 'p') ...`` when another workspace member defines it
    (best effort: any unreadable manifest means no hint)."""
    try:
        root = workspace_root(reader, manifest)
        members = workspace_members(reader, root) if root is not None and root.is_file() else []
    except FdlError:
        return ""
    taken = {p.manifest for p in selected}
    for member in members:
        if member in taken:
            continue
        try:
            package = load_package(reader, member)
        except FdlError:
            continue
        if command in package.bins:
            return (
                f"; {command!r} is in {member.parent} (package {package.name!r}), which cargo "
                "does not build from here: pick that crate directory (--crate-dir)"
            )
    return ""
