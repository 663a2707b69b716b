"""Which packages ``cargo build --bin NAME`` (no ``-p``) chooses among in a directory,
and which packages a workspace has, read from the manifests alone
(:mod:`fdl_tasks.cargo.cargo_manifest` reads each manifest and a package's binaries).

What cargo does, and what this module models (checked against cargo 1.95):

* ``--bin`` without ``-p`` picks among the packages selected by default, never
  the whole workspace: in a package directory (a workspace member, or a root
  that is both a package and a workspace) that is the current package alone;
  in a workspace root it is ``workspace.default-members`` when set (globs
  allowed), else for a virtual manifest every member, else the root package.
* Workspace members: ``members`` globs (``*``, ``?``, ``[..]``, ``**``; a glob
  that matches nothing stands for itself), minus ``exclude`` (a path prefix,
  beaten by a literal ``members`` entry), plus the root package and every path
  dependency (``dependencies``, ``dev-``, ``build-``, per-``target``, and
  ``workspace = true`` ones from ``[workspace.dependencies]``) that lies under
  the root and is not excluded, recursively.

Where cargo would reject the workspace anyway (a glob matching a directory without
a ``Cargo.toml``, a default member that is not a member, a missing path dependency),
the reader stays lenient and keeps the packages it can see: the build then fails
with cargo's own message, never because of this reader.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fdl_tasks.cargo.cargo_manifest import (
    MANIFEST,
    ManifestReader,
    Package,
    checked_table,
    find_manifest,
    is_excluded,
    load_package,
    norm,
    package_table,
)
from fdl_tasks.core.errors import FdlError

_DEP_TABLES = (
    "dependencies",
    "dev-dependencies",
    "dev_dependencies",
    "build-dependencies",
    "build_dependencies",
)


def selected_packages(crate_dir: Path) -> tuple[Package, ...]:
    """The packages ``cargo build --bin X`` (no ``-p``) chooses among in ``crate_dir``."""
    return default_packages(ManifestReader(), find_manifest(crate_dir))


def default_packages(reader: ManifestReader, manifest: Path) -> tuple[Package, ...]:
    """The packages cargo selects by default when run where ``manifest`` is found."""
    data = reader.read(manifest)
    workspace = checked_table(data, "workspace", manifest)
    package = package_table(data, manifest)
    if workspace is None and package is None:
        raise FdlError(f"{manifest} has neither [package] nor [workspace]: cargo cannot use it")
    if workspace is None:
        return (load_package(reader, manifest),)
    root = manifest.parent
    if (defaults := _strings(workspace, "default-members", manifest)) is not None:
        manifests = [
            directory / MANIFEST
            for pattern in defaults
            for directory in _expand(root, pattern)
            if (directory / MANIFEST).is_file()
        ]
    elif package is None:
        manifests = workspace_members(reader, manifest)
    else:
        manifests = [manifest]
    return tuple(load_package(reader, m) for m in dict.fromkeys(manifests))


def _strings(table: dict[str, Any], key: str, manifest: Path) -> list[str] | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise FdlError(f"{manifest}: '{key}' must be a list of paths, as cargo requires")


def _expand(root: Path, pattern: str) -> list[Path]:
    """A ``members`` entry as cargo's ``glob`` expands it (dot-entries match ``*``;
    only directories kept; no match: the entry itself)."""
    joined = os.path.join(glob.escape(str(root)), pattern)
    matches = sorted(glob.glob(joined, recursive=True, include_hidden=True))
    if not matches:
        return [norm(root / pattern)]
    return list(dict.fromkeys(norm(m) for m in matches if os.path.isdir(m)))


def workspace_members(reader: ManifestReader, root_manifest: Path) -> list[Path]:
    """Every member manifest of the workspace rooted at ``root_manifest`` (cargo's
    ``find_members``: the listed members, the root package, their path dependencies)."""
    root = root_manifest.parent
    data = reader.read(root_manifest)
    workspace = checked_table(data, "workspace", root_manifest) or {}
    shared = workspace.get("dependencies")
    shared_deps = shared if isinstance(shared, dict) else {}
    found: list[Path] = []

    def visit(manifest: Path, is_path_dep: bool) -> None:
        manifest = norm(manifest)
        if manifest in found or not manifest.is_file():
            return
        if is_path_dep and not manifest.parent.is_relative_to(root):
            return
        if is_excluded(workspace, root, manifest):
            return
        found.append(manifest)
        member = reader.read(manifest)
        if package_table(member, manifest) is None:
            return
        for directory in _path_deps(member, manifest.parent, root, shared_deps):
            visit(directory / MANIFEST, True)

    for pattern in _strings(workspace, "members", root_manifest) or []:
        for directory in _expand(root, pattern):
            visit(directory / MANIFEST, False)
    if package_table(data, root_manifest) is not None:
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
