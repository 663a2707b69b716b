"""Which binaries ``cargo build --bin NAME`` accepts in a crate directory.

``inv prebuild --cmd NAME`` builds with ``cd <crate dir> && cargo build --bin NAME``.
A misspelt name used to run preflight and every Docker build before cargo said
``no bin target named ...``; :func:`check_binary` refuses it first, in one line,
with the close matches.

What cargo does, and what this module models (checked against cargo 1.95):

* The manifest is ``<crate dir>/Cargo.toml``, else the nearest one in a parent
  directory (cargo's search from the working directory).
* ``--bin`` without ``-p`` picks among the packages selected by default, never
  the whole workspace: in a package directory (a workspace member, or a root
  that is both a package and a workspace) that is the current package alone;
  in a workspace root it is ``workspace.default-members`` when set (globs
  allowed), else for a virtual manifest every member, else the root package.
  cargo itself answers ``no bin target named `x` in default-run packages`` for
  a binary of another member; here the refusal names that member's directory.
* Workspace members: ``members`` globs (``*``, ``?``, ``[..]``, ``**``; a glob
  that matches nothing stands for itself), minus ``exclude`` (a path prefix,
  beaten by a literal ``members`` entry), plus the root package and every path
  dependency (``dependencies``, ``dev-``, ``build-``, per-``target``, and
  ``workspace = true`` ones from ``[workspace.dependencies]``) that lies under
  the root and is not excluded, recursively.
* A package's binaries: its ``[[bin]]`` names, plus auto-discovered ones unless
  ``autobins = false``: ``src/main.rs`` (named after the package, ``-`` and
  all), ``src/bin/<stem>.rs`` and ``src/bin/<dir>/main.rs`` (dot-entries
  skipped, a symlinked directory is not a directory). A discovered binary is
  dropped when a ``[[bin]]`` has its name or its ``path``. With ``[[bin]]``
  entries and no ``autobins`` key, edition 2015 (the default when ``edition``
  is absent) discovers nothing more; ``edition.workspace = true`` reads
  ``[workspace.package]`` of the root found by ``package.workspace`` or the
  parent search.

Where cargo would reject the project anyway (a ``[[bin]]`` whose file is
missing, two binaries of one name, a glob matching a directory without a
``Cargo.toml``, a default member that is not a member, a missing path
dependency), the reader stays lenient and keeps the names it can see: the build
then fails with cargo's own message, never because of this check. An
unreadable or malformed manifest that the answer depends on is an
:class:`~fdl_tasks.errors.FdlError` naming the file.

Files first, cargo only before refusing. Reading the manifests takes about a
millisecond (no subprocess) and works on Docker-mode controllers, which often
have no cargo; ``cargo metadata --no-deps --offline`` takes 0.1-0.5 s and needs
a toolchain on the controller, so it is not worth paying when the name is
found. It is asked only on the refusal path (when cargo is on ``PATH``): its
``workspace_default_members`` run from the crate directory are exactly the
selected packages, so a name it knows is accepted even if this reader missed it
(TOML 1.1 syntax that ``tomllib`` rejects but a new cargo accepts, a cargo
feature modelled here wrongly), and its list replaces the reader's in the
message. When cargo is missing, fails (a member whose path dependency does not
exist makes ``cargo metadata`` fail too), times out or prints something
unexpected, the file reading decides alone.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import json
import os
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl_tasks.errors import FdlError

__all__ = [
    "CARGO_TIMEOUT",
    "Package",
    "binary_names",
    "cargo_binary_names",
    "check_binary",
    "find_manifest",
    "selected_packages",
]

MANIFEST = "Cargo.toml"

#: Seconds ``cargo metadata`` may take before the check goes on without it.
CARGO_TIMEOUT = 5.0

#: Binaries listed in a refusal before the rest are counted.
_LISTED = 12

_DEP_TABLES = (
    "dependencies",
    "dev-dependencies",
    "dev_dependencies",
    "build-dependencies",
    "build_dependencies",
)


@dataclass(frozen=True)
class Package:
    """One cargo package: its name, its manifest and the binaries it defines."""

    name: str
    manifest: Path
    bins: frozenset[str]


# ---------------------------------------------------------------------------- public API


def find_manifest(crate_dir: Path) -> Path:
    """The ``Cargo.toml`` cargo uses when run in ``crate_dir``: there, else the nearest
    parent's (the physical path, as ``getcwd`` gives cargo)."""
    start = Path(crate_dir).resolve()
    for directory in (start, *start.parents):
        if (directory / MANIFEST).is_file():
            return directory / MANIFEST
    raise FdlError(
        f"no {MANIFEST} in {crate_dir} or any parent directory: cargo has no crate there"
    )


def selected_packages(crate_dir: Path) -> tuple[Package, ...]:
    """The packages ``cargo build --bin X`` (no ``-p``) chooses among in ``crate_dir``."""
    reader = _Reader()
    return _selected(reader, find_manifest(crate_dir))


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
    install a toolchain for it (``RUSTUP_AUTO_INSTALL=0``).
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
    reader = _Reader()
    try:
        manifest = find_manifest(crate_dir)
        selected = _selected(reader, manifest)
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
    confirmed = _ask_cargo(use_cargo, crate_dir, cargo, timeout)
    if confirmed is not None:
        if command in confirmed:
            return
        names = confirmed
    hint = _elsewhere(reader, manifest, selected, command)
    raise FdlError(_refusal(command, _location(crate_dir, manifest), names, hint))


# ---------------------------------------------------------------------------- reading manifests


class _Reader:
    """Parsed manifests, each file read once per question."""

    def __init__(self) -> None:
        self._parsed: dict[Path, dict[str, Any]] = {}

    def read(self, manifest: Path) -> dict[str, Any]:
        if manifest not in self._parsed:
            try:
                with manifest.open("rb") as handle:
                    self._parsed[manifest] = tomllib.load(handle)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
                detail = " ".join(str(error).split())
                raise FdlError(f"{manifest} is not valid TOML: {detail}") from None
            except OSError as error:
                raise FdlError(f"cannot read {manifest}: {error.strerror or error}") from None
        return self._parsed[manifest]


def _table(data: dict[str, Any], key: str, manifest: Path) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise FdlError(f"{manifest}: '{key}' must be a table, as cargo requires")


def _strings(table: dict[str, Any], key: str, manifest: Path) -> list[str] | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise FdlError(f"{manifest}: '{key}' must be a list of paths, as cargo requires")


def _package_table(data: dict[str, Any], manifest: Path) -> dict[str, Any] | None:
    """``[package]`` (or the legacy ``[project]``)."""
    package = _table(data, "package", manifest)
    return package if package is not None else _table(data, "project", manifest)


def _norm(path: Path | str) -> Path:
    """Lexically normalised (cargo's ``normalize_path``: ``.`` and ``..`` folded)."""
    return Path(os.path.normpath(path))


# ---------------------------------------------------------------------------- selection


def _selected(reader: _Reader, manifest: Path) -> tuple[Package, ...]:
    data = reader.read(manifest)
    workspace = _table(data, "workspace", manifest)
    package = _package_table(data, manifest)
    if workspace is None and package is None:
        raise FdlError(f"{manifest} has neither [package] nor [workspace]: cargo cannot use it")
    if workspace is None:
        return (_package(reader, manifest),)
    root = manifest.parent
    defaults = _strings(workspace, "default-members", manifest)
    if defaults is not None:
        manifests = _unique(
            directory / MANIFEST
            for pattern in defaults
            for directory in _expand(root, pattern)
            if (directory / MANIFEST).is_file()
        )
    elif package is None:
        manifests = _members(reader, manifest)
    else:
        manifests = [manifest]
    return tuple(_package(reader, m) for m in manifests)


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _expand(root: Path, pattern: str) -> list[Path]:
    """A ``members`` entry as cargo's ``glob`` expands it (dot-entries match ``*``;
    only directories kept; no match: the entry itself)."""
    joined = os.path.join(glob.escape(str(root)), pattern)
    matches = sorted(glob.glob(joined, recursive=True, include_hidden=True))
    if not matches:
        return [_norm(root / pattern)]
    return _unique(_norm(m) for m in matches if os.path.isdir(m))


def _excluded(workspace: dict[str, Any], root: Path, manifest: Path) -> bool:
    """cargo's ``is_excluded``: under an ``exclude`` prefix and under no literal member."""
    excludes = _loose_strings(workspace.get("exclude"))
    members = _loose_strings(workspace.get("members"))
    excluded = any(manifest.is_relative_to(root / e) for e in excludes)
    return excluded and not any(manifest.is_relative_to(root / m) for m in members)


def _loose_strings(value: Any) -> list[str]:
    """The strings of a list (anything else: none), where a wrong type is cargo's to report."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _members(reader: _Reader, root_manifest: Path) -> list[Path]:
    """Every member manifest of the workspace rooted at ``root_manifest`` (cargo's
    ``find_members``: the listed members, the root package, their path dependencies)."""
    root = root_manifest.parent
    data = reader.read(root_manifest)
    workspace = _table(data, "workspace", root_manifest) or {}
    shared = workspace.get("dependencies")
    shared_deps = shared if isinstance(shared, dict) else {}
    found: list[Path] = []

    def visit(manifest: Path, is_path_dep: bool) -> None:
        manifest = _norm(manifest)
        if manifest in found or not manifest.is_file():
            return
        if is_path_dep and not manifest.parent.is_relative_to(root):
            return
        if _excluded(workspace, root, manifest):
            return
        found.append(manifest)
        member = reader.read(manifest)
        if _package_table(member, manifest) is None:
            return
        for directory in _path_deps(member, manifest.parent, root, shared_deps):
            visit(directory / MANIFEST, True)

    for pattern in _strings(workspace, "members", root_manifest) or []:
        for directory in _expand(root, pattern):
            visit(directory / MANIFEST, False)
    if _package_table(data, root_manifest) is not None:
        visit(root_manifest, False)
    return found


def _path_deps(
    data: dict[str, Any], directory: Path, root: Path, shared: dict[str, Any]
) -> Iterator[Path]:
    """Directories of the manifest's path dependencies, every kind and target."""
    tables = [data.get(kind) for kind in _DEP_TABLES]
    targets = data.get("target")
    if isinstance(targets, dict):
        for platform in targets.values():
            if isinstance(platform, dict):
                tables.extend(platform.get(kind) for kind in _DEP_TABLES)
    for table in tables:
        if not isinstance(table, dict):
            continue
        for name, spec in table.items():
            if not isinstance(spec, dict):
                continue
            if isinstance(spec.get("path"), str):
                yield directory / spec["path"]
            elif spec.get("workspace") is True:
                inherited = shared.get(name)
                if isinstance(inherited, dict) and isinstance(inherited.get("path"), str):
                    yield root / inherited["path"]


def _workspace_root(reader: _Reader, manifest: Path) -> Path | None:
    """The root manifest of the workspace the package at ``manifest`` belongs to:
    itself, ``package.workspace``, else the nearest parent root that does not exclude it."""
    data = reader.read(manifest)
    if isinstance(data.get("workspace"), dict):
        return manifest
    package = _package_table(data, manifest) or {}
    pointer = package.get("workspace")
    if isinstance(pointer, str):
        return _norm(manifest.parent / pointer) / MANIFEST
    for directory in manifest.parent.parents:
        candidate = directory / MANIFEST
        if not candidate.is_file():
            continue
        try:
            ancestor = reader.read(candidate)
        except FdlError:
            continue
        workspace = ancestor.get("workspace")
        if isinstance(workspace, dict):
            if not _excluded(workspace, directory, manifest):
                return candidate
            continue
        ancestor_pointer = (_package_table(ancestor, candidate) or {}).get("workspace")
        if isinstance(ancestor_pointer, str):
            return _norm(directory / ancestor_pointer) / MANIFEST
    return None


# ---------------------------------------------------------------------------- one package


def _package(reader: _Reader, manifest: Path) -> Package:
    data = reader.read(manifest)
    package = _package_table(data, manifest)
    if package is None:
        raise FdlError(f"{manifest} has no [package]: cargo builds no binary from it")
    name = package.get("name")
    if not isinstance(name, str) or not name:
        raise FdlError(f"{manifest}: [package] has no name")
    directory = manifest.parent
    autobins = package.get("autobins")
    if autobins is not None and not isinstance(autobins, bool):
        raise FdlError(f"{manifest}: 'autobins' must be true or false")
    inferred = _inferred_bins(directory, name)
    declared = data.get("bin")
    if declared is None:
        names = [] if autobins is False else [n for n, _ in inferred]
        return Package(name, manifest, frozenset(names))
    if not isinstance(declared, list) or not all(isinstance(b, dict) for b in declared):
        raise FdlError(f"{manifest}: 'bin' must be an array of tables ([[bin]])")
    explicit: list[str] = []
    paths: set[Path] = set()
    for number, entry in enumerate(declared, 1):
        bin_name = entry.get("name")
        if not isinstance(bin_name, str) or not bin_name:
            raise FdlError(f"{manifest}: [[bin]] entry {number} has no name")
        explicit.append(bin_name)
        if isinstance(entry.get("path"), str):
            paths.add(directory / entry["path"])
    if autobins is None:
        autobins = not _edition_2015(reader, manifest, package)
    rest = [n for n, p in inferred if n not in explicit and p not in paths] if autobins else []
    return Package(name, manifest, frozenset(explicit + rest))


def _inferred_bins(directory: Path, package_name: str) -> list[tuple[str, Path]]:
    """cargo's ``inferred_bins``: ``src/main.rs``, ``src/bin/*.rs``, ``src/bin/*/main.rs``."""
    found: list[tuple[str, Path]] = []
    main = directory / "src" / "main.rs"
    if main.exists():
        found.append((package_name, main))
    bin_dir = directory / "src" / "bin"
    try:
        entries = sorted(os.scandir(bin_dir), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = bin_dir / entry.name
        if entry.is_dir(follow_symlinks=False):
            if (path / "main.rs").exists():
                found.append((entry.name, path / "main.rs"))
        elif path.suffix == ".rs":
            found.append((path.stem, path))
    return found


def _edition_2015(reader: _Reader, manifest: Path, package: dict[str, Any]) -> bool:
    """Whether the package is edition 2015 (no ``edition`` key); an inherited edition
    that cannot be read counts as a newer one (more binaries, never a false refusal)."""
    edition = package.get("edition")
    if edition is None:
        return True
    if isinstance(edition, dict) and edition.get("workspace") is True:
        try:
            root = _workspace_root(reader, manifest)
            shared = reader.read(root).get("workspace", {}) if root else {}
        except FdlError:
            return False
        inherited = shared.get("package", {}) if isinstance(shared, dict) else {}
        return isinstance(inherited, dict) and inherited.get("edition") == "2015"
    return bool(edition == "2015")


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


def _suggestions(command: str, names: Iterable[str]) -> list[str]:
    """Close matches, case and ``-``/``_`` folded first (``ddp_bench`` -> ``ddp-bench``)."""

    def fold(name: str) -> str:
        return name.lower().replace("_", "-")

    by_fold: dict[str, list[str]] = {}
    for name in sorted(names):
        by_fold.setdefault(fold(name), []).append(name)
    chosen = list(by_fold.get(fold(command), []))
    for key in difflib.get_close_matches(fold(command), list(by_fold), n=3, cutoff=0.6):
        chosen.extend(n for n in by_fold[key] if n not in chosen)
    return chosen[:3]


def _quoted_choice(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _refusal(command: str, location: str, names: frozenset[str], hint: str) -> str:
    parts = [f"no binary {command!r} in {location}:"]
    close = _suggestions(command, names)
    if close:
        parts.append(f"did you mean {_quoted_choice(close)}?")
    listed = sorted(names)
    if not listed:
        parts.append("it has no binary targets")
    else:
        more = len(listed) - _LISTED
        shown = ", ".join(listed[:_LISTED]) + (f", ... ({more} more)" if more > 0 else "")
        parts.append(f"binaries: {shown}")
    return " ".join(parts) + hint


def _elsewhere(reader: _Reader, manifest: Path, selected: tuple[Package, ...], command: str) -> str:
    """``; 'x' is in <dir> (package 'p') ...`` when another workspace member defines it
    (best effort: any unreadable manifest means no hint)."""
    try:
        root = _workspace_root(reader, manifest)
        members = _members(reader, root) if root is not None and root.is_file() else []
    except FdlError:
        return ""
    taken = {p.manifest for p in selected}
    for member in members:
        if member in taken:
            continue
        try:
            package = _package(reader, member)
        except FdlError:
            continue
        if command in package.bins:
            return (
                f"; {command!r} is in {member.parent} (package {package.name!r}), which cargo "
                "does not build from here: pick that crate directory (--crate-dir)"
            )
    return ""
