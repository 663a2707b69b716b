"""The units of a target dir and the files on the controller each one read.

Read after a build from what cargo and rustc left: each fingerprint directory
``<profile>/.fingerprint/<package>-<hash>``, with the files rustc's dep-info
``<profile>/deps/*-<hash>.d`` (or a build script's
``<profile>/build/<package>-<hash>/*-<hash>.d``) lists, relative to the
workspace root, and the paths its build script run declared with
``rerun-if-changed`` (relative to its package; none declared: every file of
its package). Paths a build saw in its container are mapped back through the
most specific mount.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record import RecordInputs
from fdl_tasks.cargo.cargo_outputs import dep_info_paths, rerun_paths
from fdl_tasks.config.layout import PROFILE_DIR
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.core.atomic_files import text_or_empty
from fdl_tasks.tree.scope import under
from fdl_tasks.tree.workspace import package_dirs, walk_files


def unit_reads(root: Path, job: BuildJob, inputs: RecordInputs) -> dict[str, tuple[str, ...]]:
    """Each fingerprint directory of ``job``'s target dir (relative to it) and the
    files on the controller its unit read, as the last build left them."""
    target = root / job.target_dir
    cross = job.build.cross
    profiles = [PROFILE_DIR] + ([f"{cross.target}/{PROFILE_DIR}"] if cross else [])
    workspace = _workspace_root(root / job.build.crate_dir, root)
    packages = package_dirs(posixpath.normpath(str(root)))
    variant = libtorch_dir(str(root), job.build.arch)
    mounts = inputs.mounts or ((str(root), str(root)),)

    def placed(path: str, base: Sequence[str]) -> list[str]:
        if not path.startswith("/"):
            return [posixpath.normpath(posixpath.join(b, path)) for b in base]
        found = _controller_path(path, mounts, variant)
        return [found] if found else []

    units: dict[str, tuple[str, ...]] = {}
    for profile in profiles:
        directory = target / profile
        dep_infos = _dep_infos_by_hash(directory)
        try:
            fingerprints = sorted(os.scandir(directory / ".fingerprint"), key=lambda e: e.name)
        except OSError:
            continue
        for fingerprint in fingerprints:
            package, _, digest = fingerprint.name.rpartition("-")
            paths: list[str] = []
            for dep_info in dep_infos.get(digest, ()):
                for raw in dep_info_paths(text_or_empty(dep_info)):
                    paths += placed(raw, [workspace])
            for run in Path(fingerprint.path).glob("run-build-script-*.json"):
                declared = rerun_paths(text_or_empty(run))
                homes = packages.get(package, [])
                if declared is None:
                    paths += [f for home in homes for f in walk_files(home, home)]
                for raw in declared or ():
                    paths += placed(raw, homes)
            units[f"{profile}/.fingerprint/{fingerprint.name}"] = tuple(dict.fromkeys(paths))
    return units


def _dep_infos_by_hash(profile: Path) -> dict[str, list[str]]:
    """rustc's dep-info files of a profile directory, by the unit hash that ends their
    name (``deps/<crate>-<hash>.d``, ``build/<pkg>-<hash>/build_script_build-<hash>.d``)."""
    found: dict[str, list[str]] = {}
    for path in [*profile.glob("deps/*.d"), *profile.glob("build/*/*.d")]:
        found.setdefault(path.stem.rpartition("-")[2], []).append(str(path))
    return found


def _workspace_root(crate_dir: Path, root: Path) -> str:
    """Where cargo runs rustc from (the paths of dep-info are relative to it): the
    nearest directory up to the project root whose ``Cargo.toml`` has ``[workspace]``,
    else the nearest one with a ``Cargo.toml`` (the crate's package)."""
    directory, package = posixpath.normpath(str(crate_dir)), None
    while under(directory, str(root)):
        manifest = text_or_empty(posixpath.join(directory, "Cargo.toml"))
        if "[workspace]" in manifest:
            return directory
        package = package or (directory if manifest else None)
        if directory == posixpath.dirname(directory):
            break
        directory = posixpath.dirname(directory)
    return package or posixpath.normpath(str(crate_dir))


def _controller_path(
    path: str, mounts: Sequence[tuple[str, str | None]], variant: str
) -> str | None:
    """``path`` as the build saw it, on the controller: through the most specific mount,
    as Docker resolves it (``None`` mount: the build's variant); ``None`` for what only
    the image holds (its id is in the identity)."""
    for inside, outside in sorted(mounts, key=lambda m: len(m[0]), reverse=True):
        if under(path, inside):
            rest = path[len(inside) :].lstrip("/")
            return posixpath.normpath(posixpath.join(outside or variant, rest))
    return None
