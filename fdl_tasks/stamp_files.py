"""Build stamps on disk: the look at what a build reads, and the stamp file beside its target dir.

Thin I/O over :mod:`fdl_tasks.build_stamps`. A look walks the project as the
watcher does (``target/``, version control and tool caches skipped) and the
build's libtorch variant whole. Outside those trees it lists the directories
of every file the last build's cargo dep-info names (a path dependency in a
mount) and of every path a build script declared with ``rerun-if-changed``
(``.git/HEAD``, say), and the user's own mounts two levels deep. The file
system's clock is read from the target dir's marker, which the build rewrote
a moment before: on a mount whose clock is not this machine's, "too recent to
trust" is judged by the mount's own time."""

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
from fdl_tasks.watch.buildscripts import declared_inputs, host_path, target_dirs
from fdl_tasks.watch.roots import WatchPlan
from fdl_tasks.watch.scan import entry_of, scan
from fdl_tasks.watch.scope import Scope, hidden, under
from fdl_tasks.watch.snapshot import Entry, Snapshot
from fdl_tasks.watch.workspace import build_outputs, package_dirs


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
        """Whether ``job``'s binary is up to date; the old stamp is removed when it is not
        (a build stopped half-way must never leave one claiming its binary)."""
        inputs = self.inputs(job)
        if inputs is None:
            return Check(False)
        path = stamp_file(self.root, job)
        stamp = _read(path)
        look = self.look(job, inputs, stamp.inputs if stamp else None)
        binary = _entry(self.root / job.built_binary)
        if up_to_date(stamp, inputs.identity, look, binary):
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

    def look(self, job: BuildJob, inputs: StampInputs, previous: Snapshot | None) -> Snapshot:
        """The project and the variant whole; the directories of the declared paths and
        dep-info entries outside them; the user's mounts two levels deep."""
        root = posixpath.normpath(str(self.root))
        trees = (root, libtorch_dir(root, job.build.arch))
        packages = package_dirs(root)
        declared, _ = declared_inputs(
            build_outputs(self.root, target_dirs([job])), packages, inputs.mounts
        )
        listed = [host_path(p, inputs.mounts) for p in _dep_info(self.root, job)]
        flat = {
            posixpath.dirname(p)
            for p in [*declared, *(p for p in listed if p)]
            if hidden(p, root) or not any(under(p, t) for t in trees)
        }
        flat |= {d for source in inputs.shallow for d in (source, *_subdirs(source))}
        excluded = {posixpath.join(root, "target"), *self.excluded}
        excluded |= {posixpath.join(d, "target") for dirs in packages.values() for d in dirs}
        scope = Scope(root, "", excluded=tuple(sorted(excluded)))
        plan = WatchPlan(trees, tuple(sorted(flat)))
        clock = _clock_ns(self.root / job.target_dir)
        return scan(plan, scope, previous, clock, lambda _: True)


def _dep_info(root: Path, job: BuildJob) -> list[str]:
    """What cargo's dep-info of the last build lists (none before a first build)."""
    try:
        return dep_info_paths((root / f"{job.built_binary}.d").read_text(encoding="utf-8"))
    except OSError:
        return []


def _subdirs(path: str) -> list[str]:
    with contextlib.suppress(OSError), os.scandir(path) as found:
        return [e.path for e in found if e.is_dir()]
    return []


def _read(path: Path) -> BuildStamp | None:
    try:
        return BuildStamp.from_json(path.read_text(encoding="utf-8"))
    except OSError:
        return None


def _entry(path: Path) -> Entry | None:
    try:
        return entry_of(path.stat())
    except OSError:
        return None


def _clock_ns(target_dir: Path) -> int:
    """The mount's clock: the time of the marker the build has just rewritten, else this
    machine's. A moment old, it errs on the safe side (more files look too recent)."""
    try:
        return (target_dir / MARKER_FILE).stat().st_mtime_ns
    except OSError:
        return time.time_ns()
