"""Build records on disk: the look at what a build reads, the units cargo's dep-info
names, the forced units' fingerprints removed, and the record file beside the target dir.

Thin I/O over :mod:`fdl_tasks.build.build_record`. A look walks the project as the
watcher does (``target/``, version control and tool caches skipped), the
build's libtorch variant and each of the user's mounts whole, and lists the
directory of every file a unit named (``.git/HEAD``, a path dependency in a
mount). It reads the content of every file that counts (sources, manifests,
what a unit named) whose stat moved or was racy; the variant and the mounts
are looked at by stat alone. Paths a build saw in its container are mapped
back through the most specific mount.

The units and what each read come from :mod:`fdl_tasks.build.unit_reads`. A
forced unit's fingerprint directory is removed before cargo runs: cargo rebuilds
that unit and its dependents, in that target dir only, and never sees the user's
files touched.
"""

from __future__ import annotations

import contextlib
import posixpath
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import attrs

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record import (
    BuildRecord,
    Freshness,
    RecordInputs,
    as_read,
    named,
    reused_digest,
    verdict,
)
from fdl_tasks.build.record_attempt import attempt_json
from fdl_tasks.build.record_files import (
    RECORD_NAME,
    attempt_file,
    file_stats,
    read_record,
    record_file,
)
from fdl_tasks.build.record_plan import look_plan
from fdl_tasks.build.unit_reads import unit_reads
from fdl_tasks.config.layout import MARKER_FILE
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.binary_files import BinaryFacts
from fdl_tasks.core.errors import FdlError
from fdl_tasks.tree.scan import Listings, entry_of, scan
from fdl_tasks.tree.scope import Scope, under
from fdl_tasks.tree.snapshot import Entry, Snapshot, union


@attrs.frozen
class Check:
    """A build's check against its record: ``verdict.fresh`` when cargo can be skipped
    (``record``: the one its target dir holds, which stays); ``look``, taken before cargo,
    becomes the next record if the build succeeds."""

    verdict: Freshness
    look: Snapshot
    inputs: RecordInputs
    record: BuildRecord | None = None
    #: What the units named as the look was taken (it read each of them by content).
    reads: frozenset[str] = frozenset()


@attrs.frozen
class Seen:
    """What a check read, before it acts: the inputs it was ``asked`` with and the record's
    and attempt's files (``files``) as it found them, which a later check must find too."""

    asked: RecordInputs
    files: tuple[tuple[int, int, int] | None, ...]
    on_disk: BuildRecord | None
    record: BuildRecord | None
    inputs: RecordInputs
    look: Snapshot
    reads: frozenset[str]
    found: Freshness


class Records:
    """The records of one run's builds. ``inputs``: the backend's for a job; ``skip``:
    whether a fresh build may skip cargo (``fdl.skip_unchanged``); ``excluded``:
    directories no build reads (the compile cache)."""

    def __init__(
        self,
        root: Path,
        inputs: Callable[[BuildJob], RecordInputs],
        *,
        skip: bool = True,
        excluded: Sequence[str] = (),
    ) -> None:
        self.root, self.inputs, self.skip = root, inputs, skip
        top = posixpath.normpath(str(root))
        # A walk skips a target/ beside any Cargo.toml by itself.
        skipped = {posixpath.join(top, "target"), *excluded}
        self.scope = Scope(top, (), excluded=tuple(sorted(skipped)))
        #: Whether the scope counts a path as a source, as found by the run's looks so far.
        self._sources: dict[str, bool] = {}
        #: One look at a time: looks side by side only take turns with the interpreter's
        #: lock, at every stat, and every build's cargo would start later.
        self._one_look = threading.Lock()
        #: Job name → what :meth:`look_ahead` saw, and the listings those looks share.
        self._ahead: dict[str, Seen] = {}
        self._together = Listings()

    def check(self, job: BuildJob) -> Check:
        """What ``job``'s build must do. A unit that read a file changed by content has
        its fingerprint removed now. A command's first build in a target dir compares
        with another command's record there; without a record it can trust (none, torn,
        of another version), every unit that read the project is forced. The record stays
        until the next good build replaces it, with this build's look as an attempt: a
        failed or stopped build may have compiled what it saw, so the next build compares
        with both. What :meth:`look_ahead` saw is taken while the record's files are as
        they were then."""
        inputs = self.inputs(job)
        path = record_file(self.root, job)
        seen = self._ahead.pop(job.name, None)
        if seen is None or seen.asked != inputs or seen.files != file_stats(path):
            seen = self._see(job, inputs, path)
        found, record = seen.found, seen.record
        if not found.fresh:
            if record is not None and path.exists():  # until this build ends well
                attempt = attempt_json(record, union(record.attempt, seen.look))
                with contextlib.suppress(FdlError):
                    write_atomically(attempt_file(path), attempt)
            self.force(job, found.forced)
        on_disk = seen.on_disk if found.fresh else None
        return Check(found, seen.look, seen.inputs, on_disk, seen.reads)

    def look_ahead(self, job: BuildJob) -> bool:
        """Beside preflight, before the project lock: what :meth:`check` reads (the record,
        the look, the verdict), kept for it; nothing written. A look taken earlier is
        never less safe: whatever changes after it differs from it at the next check.
        Not for a command's first build in its target dir (it reads other records).
        Whether the build will run cargo, as far as this look can tell."""
        path = record_file(self.root, job)
        if not path.exists():
            return True
        seen = self._ahead[job.name] = self._see(job, self.inputs(job), path, self._together)
        return not seen.found.fresh

    def _see(
        self, job: BuildJob, asked: RecordInputs, path: Path, together: Listings | None = None
    ) -> Seen:
        """What a check reads, before it acts on it (``together``: listings shared)."""
        inputs = asked if self.skip else attrs.evolve(asked, identity=None)
        files = file_stats(path)
        record = on_disk = read_record(path)  # a fresh build keeps it as it is on disk
        identity = inputs.identity
        if record is None and not path.exists():  # this command's first build here
            record, identity = self.nearest(job), None
        units: Mapping[str, tuple[str, ...]]
        if record is None or record.attempt is not None:  # what the target dir holds now too
            units = {**unit_reads(self.root, job, inputs), **(record.units if record else {})}
            record = attrs.evolve(record, units=units) if record else None
        else:
            units = record.units
        reads = frozenset(named(units))
        look, whole = self.look(job, inputs, record.look if record else None, reads, together)
        if not whole:
            inputs = attrs.evolve(inputs, identity=None)
        if record is None:  # every unit that read the project: what it read is not known
            found = Freshness(False, tuple(sorted(unit for unit, paths in units.items() if paths)))
        else:
            found = verdict(record, identity, look, _entry(self.root / job.built_binary))
        return Seen(asked, files, on_disk, record, inputs, look, reads, found)

    def nearest(self, job: BuildJob) -> BuildRecord | None:
        """The newest record another command's good build left in ``job``'s target dir:
        the units they share were built from what it read (so a second command
        compiles only what it adds)."""
        found = [
            record
            for path in (self.root / job.target_dir).glob(RECORD_NAME.format("*"))
            if (record := read_record(path)) is not None
        ]
        return max(found, key=lambda record: record.look.taken_ns, default=None)

    def force(self, job: BuildJob, units: Sequence[str]) -> None:
        """Remove these units' fingerprints in ``job``'s target dir: cargo rebuilds them.
        A build script's run takes its package's other units with it: cargo decides their
        freshness before the script reruns, and a run whose fingerprint is gone is not
        seen as newer than them (checked with cargo 1.95)."""
        target = self.root / job.target_dir
        for unit in units:
            fingerprint = target / unit
            if fingerprint.parent.name != ".fingerprint":
                continue
            doomed = [fingerprint]
            if any(fingerprint.glob("run-build-script-*")):
                package = fingerprint.name.rpartition("-")[0]
                doomed += [
                    sibling
                    for sibling in fingerprint.parent.iterdir()
                    if sibling.name.rpartition("-")[0] == package
                ]
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)

    def record(self, job: BuildJob, check: Check, facts: BinaryFacts | None) -> BuildRecord | None:
        """After a build that succeeded: its record, from the look taken before cargo
        ran and what its units named after it, with the binary's ``facts`` (``None``:
        none written). A second look only when they name a file the first did not read
        by content."""
        binary = _entry(self.root / job.built_binary)
        if binary is None:
            return None
        units = unit_reads(self.root, job, check.inputs)
        look, reads = check.look, named(units)
        if not reads <= check.reads:  # a file first read now: looked at (as_read says how)
            look = as_read(look, self.look(job, check.inputs, look, reads)[0])
        record = BuildRecord(check.inputs.identity, look, units, binary, built=facts)
        path = record_file(self.root, job)
        try:
            write_atomically(path, record.to_json())
        except FdlError:  # no record only costs the next build a rebuild
            return None
        with contextlib.suppress(OSError):  # one left is of the record replaced: not read
            attempt_file(path).unlink(missing_ok=True)
        return record

    def look(
        self,
        job: BuildJob,
        inputs: RecordInputs,
        previous: Snapshot | None,
        reads: AbstractSet[str],
        together: Listings | None = None,
    ) -> tuple[Snapshot, bool]:
        """The look at what ``job``'s build reads (``reads``: what its units named), and
        whether it saw all of it (else cargo must run); ``together``: what the looks of
        one moment listed (the builds' looks beside preflight), reused."""
        root = self.scope.root
        variant = libtorch_dir(root, job.build.arch)

        def counts(path: str) -> bool:
            """Read by content: what a unit named and the project's sources; never the
            variant (its libraries run to gigabytes: its stat decides)."""
            if under(path, variant):
                return False
            if path in reads or any(under(path, t) for t in read_trees):
                return True
            return not any(under(path, t) for t in mounted) and self.source(path)

        def unnamed(path: str) -> bool:
            """A file changed in the last seconds, which this build may be the first to
            read: its content as the build starts (the variant apart)."""
            return not under(path, variant)

        with self._one_look:
            plan, whole = look_plan(job, inputs, root, reads)
            mounted = [t for t in plan.recursive if t != root and t not in reads]
            read_trees = [t for t in plan.recursive if t in reads]
            clock = _clock_ns(self.root / job.target_dir)
            if together is not None:
                clock = together.clock(clock)
            look = scan(plan, self.scope, previous, clock, counts, reused_digest, unnamed, together)
        return look, whole

    def source(self, path: str) -> bool:
        """Whether the project's scope counts ``path`` (the same for every build's look)."""
        found = self._sources.get(path)
        if found is None:
            found = self._sources[path] = self.scope.classify(path) is not None
        return found


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
