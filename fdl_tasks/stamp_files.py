"""Build stamps on disk: the look at what a build reads, and the stamp file beside its target dir.

Thin I/O over :mod:`fdl_tasks.build_stamps`. A look walks the project as the
watcher does (``target/``, version control and tool caches skipped), the
build's libtorch variant and each of the user's mounts whole, and the
directories a build script declared with ``rerun-if-changed`` outside those.
It lists the directory of every file the last build's cargo dep-info names
(a path dependency in a mount) or a build script declared (``.git/HEAD``, say),
and of a mounted rustup home what an install or update rewrites. Paths the
build saw in its container are mapped back through the most specific mount.
Where the look cannot see an input (a named path missing, a mount too big to
walk), there is no stamp and cargo decides."""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fdl_tasks.atomic_files import write_atomically
from fdl_tasks.build_environment import BuildJob
from fdl_tasks.build_stamps import (
    BuildStamp,
    StampInputs,
    dep_info_paths,
    stamp_after_build,
    up_to_date,
)
from fdl_tasks.errors import FdlError
from fdl_tasks.layout import MARKER_FILE
from fdl_tasks.variants import libtorch_dir
from fdl_tasks.watch.buildscripts import rerun_declarations, target_dirs
from fdl_tasks.watch.roots import WatchPlan
from fdl_tasks.watch.scan import entry_of, scan
from fdl_tasks.watch.scope import Scope, under
from fdl_tasks.watch.snapshot import Entry, Snapshot
from fdl_tasks.watch.workspace import build_outputs, package_dirs, walk_files

#: A user mount holding more files than this is not walked: its builds always run cargo.
MOUNT_BUDGET = 20_000


def stamp_file(root: Path, job: BuildJob) -> Path:
    """One stamp per command in each target dir (a target dir builds every command)."""
    return root / job.target_dir / f".fdl-stamp-{job.build.command}.json"


@attrs.frozen
class Check:
    """A build's stamp check: ``fresh`` when cargo can be skipped; ``look``, taken before
    cargo, becomes the next stamp if the build succeeds."""

    fresh: bool
    look: Snapshot | None = None
    inputs: StampInputs | None = None


class Stamps:
    """The stamps of one run's builds. ``inputs``: the backend's for a job (``None``: this
    build always runs cargo); ``excluded``: directories no build reads (the compile cache)."""

    def __init__(
        self,
        root: Path,
        inputs: Callable[[BuildJob], StampInputs | None],
        excluded: Sequence[str] = (),
    ) -> None:
        self.root, self.inputs, self.excluded = root, inputs, tuple(excluded)

    def check(self, job: BuildJob) -> Check:
        """Whether ``job``'s binary is up to date. A stamp that is not is removed before
        cargo runs, so a build stopped half-way never leaves one claiming its binary.
        (Without inputs, any old stamp stays: it cannot be fresh while stamps are off,
        and once they are on again its binary's stat tells a rebuild apart.)"""
        inputs = self.inputs(job)
        if inputs is None:
            return Check(False)
        path = stamp_file(self.root, job)
        stamp = _read(path)
        look = self.look(job, inputs, stamp.inputs if stamp else None)
        binary = _entry(self.root / job.built_binary)
        if look is not None and up_to_date(stamp, inputs.identity, look, binary):
            return Check(True, look, inputs)
        path.unlink(missing_ok=True)
        return Check(False, look, inputs)

    def record(self, job: BuildJob, check: Check) -> None:
        """After a build that succeeded: its stamp, from the look taken before cargo ran."""
        binary = _entry(self.root / job.built_binary)
        if check.inputs is None or check.look is None or binary is None:
            return
        stamp = stamp_after_build(check.inputs.identity, check.look, binary)
        with contextlib.suppress(FdlError):  # no stamp only costs the next no-op a container
            write_atomically(stamp_file(self.root, job), stamp.to_json())

    def look(
        self, job: BuildJob, inputs: StampInputs, previous: Snapshot | None
    ) -> Snapshot | None:
        """The look at what ``job``'s build reads; ``None`` when something it reads
        cannot be looked at (then it always runs cargo)."""
        root = posixpath.normpath(str(self.root))
        try:
            plan, packages, named = self.plan(job, inputs, root)
            excluded = {posixpath.join(root, "target"), *self.excluded}
            excluded |= {posixpath.join(d, "target") for dirs in packages.values() for d in dirs}
            scope = Scope(root, "", excluded=tuple(sorted(excluded)))
            clock = _clock_ns(self.root / job.target_dir)
            snapshot = scan(plan, scope, previous, clock, lambda _: True)
        except (_Unseen, OSError):
            return None
        # Every file the build named must be in the look: one in a directory that could not
        # be listed, or gone meanwhile, would never be compared.
        seen = all(
            (p in snapshot.dirs) if p in plan.recursive else (p in snapshot.entries) for p in named
        )
        return snapshot if seen else None

    def plan(
        self, job: BuildJob, inputs: StampInputs, root: str
    ) -> tuple[WatchPlan, dict[str, list[str]], list[str]]:
        """The trees walked, the directories listed, the packages, and the paths the last
        build named (:class:`_Unseen` when one is missing or relative, or a mount is too
        big to walk)."""
        packages = package_dirs(root)
        mounted = [_walkable(source) for source in inputs.walked if not os.path.isfile(source)]
        for tree in mounted:  # a path dependency mounted from outside the project
            for name, dirs in package_dirs(tree).items():
                packages.setdefault(name, []).extend(dirs)
        named = [
            path
            for raw in _dep_info(self.root, job)
            if (path := _controller_path(raw, inputs.mounts)) is not None
        ]
        for name, text in build_outputs(self.root, target_dirs([job])):
            for raw in rerun_declarations(text):
                if raw.startswith("/"):
                    named += [p for p in [_controller_path(raw, inputs.mounts)] if p]
                else:
                    named += [
                        posixpath.normpath(posixpath.join(d, raw)) for d in packages.get(name, ())
                    ]
        if not all(os.path.exists(path) for path in named):
            raise _Unseen  # cargo would rerun what depends on it: so does the build
        trees = {root, libtorch_dir(root, job.build.arch)}
        trees |= {p for p in named if os.path.isdir(p)}  # cargo looks inside, at any depth
        trees |= set(mounted)
        flat = {posixpath.dirname(source) for source in inputs.walked if os.path.isfile(source)}
        for home in inputs.rustup:
            flat |= _rustup_dirs(home)
        # Listed even inside a tree: a walk skips hidden and tool directories.
        flat |= {posixpath.dirname(p) for p in named if not os.path.isdir(p)}
        return WatchPlan(tuple(sorted(trees)), tuple(sorted(flat - trees))), packages, named


class _Unseen(Exception):
    """Something the build reads cannot be looked at: no stamp, cargo decides."""


def _controller_path(path: str, mounts: Sequence[tuple[str, str | None]]) -> str | None:
    """``path`` as the build saw it, on the controller: through the most specific mount,
    as Docker resolves it; ``None`` for the variant (its own tree) and for what only the
    image holds (its id is in the identity)."""
    if not path.startswith("/"):
        raise _Unseen  # a dep-info written relative to a base dir this look does not know
    for inside, outside in sorted(mounts, key=lambda m: len(m[0]), reverse=True):
        if under(path, inside):
            if outside is None:
                return None
            return posixpath.normpath(outside + "/" + path[len(inside) :].lstrip("/"))
    return None


def _walkable(source: str) -> str:
    """A user mount to walk whole: it must exist and hold at most :data:`MOUNT_BUDGET`
    files (a look costs a stat per file)."""
    if not os.path.isdir(source):
        raise _Unseen
    if sum(1 for _ in walk_files(source, source, MOUNT_BUDGET + 1)) > MOUNT_BUDGET:
        raise _Unseen
    return posixpath.normpath(source)


def _rustup_dirs(home: str) -> set[str]:
    """What ``rustup`` rewrites when it installs or updates a toolchain: the home's
    ``settings.toml``, ``update-hashes/<toolchain>`` and each toolchain's channel
    manifest (``toolchains/<toolchain>/lib/rustlib/``)."""
    toolchains = posixpath.join(home, "toolchains")
    if not os.path.isdir(toolchains):
        raise _Unseen
    try:
        with os.scandir(toolchains) as found:
            rustlibs = {posixpath.join(e.path, "lib", "rustlib") for e in found if e.is_dir()}
    except OSError:
        raise _Unseen from None
    return {home, posixpath.join(home, "update-hashes"), toolchains, *rustlibs}


def _dep_info(root: Path, job: BuildJob) -> list[str]:
    """What cargo's dep-info of the last build lists (none before a first build)."""
    try:
        return dep_info_paths((root / f"{job.built_binary}.d").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        raise _Unseen from None  # unreadable or torn: what it names is unknown


def _read(path: Path) -> BuildStamp | None:
    try:
        return BuildStamp.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not UTF-8 either: no stamp, a build
        return None


def _entry(path: Path) -> Entry | None:
    try:
        return entry_of(path.stat())
    except OSError:
        return None


def _clock_ns(target_dir: Path) -> int:
    """The file systems' clock: the earlier of this machine's and the time of the marker
    the build has just rewritten (an earlier clock makes more files too recent to trust,
    never fewer). A mount of another server whose clock runs behind both is not known."""
    now = time.time_ns()
    try:
        return min(now, (target_dir / MARKER_FILE).stat().st_mtime_ns)
    except OSError:
        return now
