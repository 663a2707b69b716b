"""Did a build's dependencies change since its target dir was last built?

With the compile cache, a change that makes every variant recompile its
dependencies (a new dependency, ``cargo update``, a dependency's features)
should cost about one build, not one per variant: the first build then runs
alone and fills the cache, the others hit it (:func:`fdl_tasks.build.builder.head_start`).
The sign is cheap and only schedules: a workspace manifest, ``Cargo.lock`` or
``.cargo/config*`` newer than the last build of some target dir (its marker
file is rewritten when each build starts). A wrong guess costs at most the
parallelism of one run, never a wrong binary: cargo's fingerprints still
decide what is rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fdl_tasks.cargo.cargo_manifest import ManifestReader, find_manifest, workspace_root
from fdl_tasks.cargo.cargo_workspace import workspace_members
from fdl_tasks.core.errors import FdlError


def dependency_files(crate_dir: Path) -> list[Path]:
    """The workspace's manifests, its ``Cargo.lock`` and cargo config files."""
    reader = ManifestReader()
    manifest = find_manifest(crate_dir)
    root = workspace_root(reader, manifest) or manifest
    files = [manifest, root, *workspace_members(reader, root), root.parent / "Cargo.lock"]
    for directory in {root.parent, manifest.parent}:
        files += sorted((directory / ".cargo").glob("config*"))
    return files


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def changed_since(crate_dirs: Iterable[Path], markers: Iterable[Path]) -> bool:
    """A dependency file is newer than the oldest marker (``False`` when unsure)."""
    built = [t for t in map(_mtime, markers) if t is not None]
    if not built:
        return False
    try:
        files = [f for d in set(crate_dirs) for f in dependency_files(d)]
    except FdlError:
        return False
    return any((t := _mtime(f)) is not None and t > min(built) for f in files)
