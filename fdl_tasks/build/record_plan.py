"""What a build record's look covers: the project and the build's variant, each of the
user's mounts whole (within :data:`MOUNT_BUDGET`), the files rustup rewrites when a Rust
release changes, and the directory of every file a unit named.

Thin I/O: whether a path is a file or a directory, a mount's size, rustup's releases.
"""

from __future__ import annotations

import itertools
import os
import posixpath
from collections.abc import Set as AbstractSet

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record import RecordInputs
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.tree.roots import WatchPlan
from fdl_tasks.tree.workspace import walk_files

#: A user mount holding more files than this is not walked: its builds always run cargo.
MOUNT_BUDGET = 20_000


def look_plan(
    job: BuildJob, inputs: RecordInputs, root: str, reads: AbstractSet[str]
) -> tuple[WatchPlan, bool]:
    """The trees walked and the directories listed; ``False`` when a mount cannot be
    looked at whole (too big, missing): the build then always runs cargo."""
    whole = True
    trees = {root, libtorch_dir(root, job.build.arch)}
    flat: set[str] = set()
    for source in inputs.walked:
        if os.path.isfile(source):
            flat.add(posixpath.dirname(source))
        elif _walkable(source):
            trees.add(posixpath.normpath(source))
        else:
            whole = False
    for home in inputs.rustup:
        found = _rustup_dirs(home)
        whole = whole and found is not None
        flat |= found or set()
    named_dirs = {p for p in reads if os.path.isdir(p)}
    trees |= named_dirs  # cargo looks inside, at any depth
    # Listed even inside a tree: a walk skips hidden and tool directories.
    flat |= {posixpath.dirname(p) for p in reads if p not in named_dirs}
    return WatchPlan(tuple(sorted(trees)), tuple(sorted(flat - trees))), whole


def _walkable(source: str) -> bool:
    """A user mount to walk whole: it must exist and hold at most :data:`MOUNT_BUDGET`
    files (a look costs a stat per file)."""
    files = itertools.islice(walk_files(source, source), MOUNT_BUDGET + 1)
    return os.path.isdir(source) and sum(1 for _ in files) <= MOUNT_BUDGET


def _rustup_dirs(home: str) -> set[str] | None:
    """What ``rustup`` rewrites when it installs or updates a Rust release: the home's
    ``settings.toml``, ``update-hashes/<release>`` and each release's channel manifest
    (``toolchains/<release>/lib/rustlib/``, rustup's own path); ``None`` when not found."""
    releases = posixpath.join(home, "toolchains")
    try:
        with os.scandir(releases) as found:
            rustlibs = {posixpath.join(e.path, "lib", "rustlib") for e in found if e.is_dir()}
    except OSError:
        return None
    return {home, posixpath.join(home, "update-hashes"), releases, *rustlibs}
