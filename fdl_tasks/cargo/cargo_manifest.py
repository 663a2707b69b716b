"""cargo manifests read from the files alone: where ``Cargo.toml`` is, which workspace a
package belongs to, and which binaries a package defines.

No cargo and no subprocess: each ``Cargo.toml`` is parsed with ``tomllib`` (TOML 1.0)
at most once per :class:`ManifestReader`. Which packages ``cargo build --bin`` picks among is
:mod:`fdl_tasks.cargo.cargo_workspace`'s part.

What cargo does, and what this module models (checked against cargo 1.95):

* The manifest is ``<crate dir>/Cargo.toml``, else the nearest one in a parent
  directory (cargo's search from the working directory).
* A package's binaries: its ``[[bin]]`` names, plus auto-discovered ones unless
  ``autobins = false``: ``src/main.rs`` (named after the package, ``-`` and
  all), ``src/bin/<stem>.rs`` and ``src/bin/<dir>/main.rs`` (dot-entries
  skipped, a symlinked directory is not a directory). A discovered binary is
  dropped when a ``[[bin]]`` has its name or its ``path``. With ``[[bin]]``
  entries and no ``autobins`` key, edition 2015 (the default when ``edition``
  is absent) discovers nothing more; ``edition.workspace = true`` reads
  ``[workspace.package]`` of the root found by ``package.workspace`` or the
  parent search (the nearest root that does not ``exclude`` the package).

Where cargo would reject the package anyway (a ``[[bin]]`` whose file is missing,
two binaries of one name), the reader stays lenient and keeps the names it can see:
the build then fails with cargo's own message, never because of this reader. An
unreadable or malformed manifest that the answer depends on is an
:class:`~fdl_tasks.core.errors.FdlError` naming the file.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl_tasks.core.errors import FdlError

MANIFEST = "Cargo.toml"


@dataclass(frozen=True)
class Package:
    """One cargo package: its name, its manifest and the binaries it defines."""

    name: str
    manifest: Path
    bins: frozenset[str]


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


# ---------------------------------------------------------------------------- reading manifests


class ManifestReader:
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


def checked_table(data: dict[str, Any], key: str, manifest: Path) -> dict[str, Any] | None:
    """``data[key]``, which cargo requires to be a table when present."""
    value = data.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise FdlError(f"{manifest}: '{key}' must be a table, as cargo requires")


def package_table(data: dict[str, Any], manifest: Path) -> dict[str, Any] | None:
    """``[package]`` (or the legacy ``[project]``)."""
    package = checked_table(data, "package", manifest)
    return package if package is not None else checked_table(data, "project", manifest)


def norm(path: Path | str) -> Path:
    """Lexically normalised (cargo's ``normalize_path``: ``.`` and ``..`` folded)."""
    return Path(os.path.normpath(path))


# ---------------------------------------------------------------------------- the workspace


def is_excluded(workspace: dict[str, Any], root: Path, manifest: Path) -> bool:
    """cargo's ``is_excluded``: under an ``exclude`` prefix and under no literal member."""
    excludes = _loose_strings(workspace.get("exclude"))
    members = _loose_strings(workspace.get("members"))
    excluded = any(manifest.is_relative_to(root / e) for e in excludes)
    return excluded and not any(manifest.is_relative_to(root / m) for m in members)


def _loose_strings(value: Any) -> list[str]:
    """The strings of a list (anything else: none), where a wrong type is cargo's to report."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def workspace_root(reader: ManifestReader, manifest: Path) -> Path | None:
    """The root manifest of the workspace the package at ``manifest`` belongs to:
    itself, ``package.workspace``, else the nearest parent root that does not exclude it."""
    data = reader.read(manifest)
    if isinstance(data.get("workspace"), dict):
        return manifest
    package = package_table(data, manifest) or {}
    pointer = package.get("workspace")
    if isinstance(pointer, str):
        return norm(manifest.parent / pointer) / MANIFEST
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
            if not is_excluded(workspace, directory, manifest):
                return candidate
            continue
        ancestor_pointer = (package_table(ancestor, candidate) or {}).get("workspace")
        if isinstance(ancestor_pointer, str):
            return norm(directory / ancestor_pointer) / MANIFEST
    return None


# ---------------------------------------------------------------------------- one package


def load_package(reader: ManifestReader, manifest: Path) -> Package:
    """The package ``manifest`` defines, with every binary cargo builds from it."""
    data = reader.read(manifest)
    package = package_table(data, manifest)
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


def _edition_2015(reader: ManifestReader, manifest: Path, package: dict[str, Any]) -> bool:
    """Whether the package is edition 2015 (no ``edition`` key); an inherited edition
    that cannot be read counts as a newer one (more binaries, never a false refusal)."""
    edition = package.get("edition")
    if edition is None:
        return True
    if isinstance(edition, dict) and edition.get("workspace") is True:
        try:
            root = workspace_root(reader, manifest)
            shared = reader.read(root).get("workspace", {}) if root else {}
        except FdlError:
            return False
        inherited = shared.get("package", {}) if isinstance(shared, dict) else {}
        return isinstance(inherited, dict) and inherited.get("edition") == "2015"
    return bool(edition == "2015")
