"""``inv prebuild --watch``: the loop of cycles, each one :func:`pipeline.prebuild`.

Thin: the cycles run in the main thread, so Ctrl-C and SIGTERM stop a build
the way they stop a plain prebuild; file events arrive from the
:class:`~fdl_tasks.watch.watcher.Watcher`'s threads.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping

import attrs

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import target_dirs
from fdl_tasks.build.clean import remove_warm
from fdl_tasks.config.loader import load_cluster
from fdl_tasks.config.run import Run
from fdl_tasks.core.errors import FdlError, LeftRunning, Stopped, StoppedLeftRunning
from fdl_tasks.core.interrupts import sigterm_as_interrupt
from fdl_tasks.core.reporting import Severity
from fdl_tasks.core.standbys import Standbys
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.publish import pipeline
from fdl_tasks.publish.envelope import hand_over, published_path
from fdl_tasks.timings.recording import recorded
from fdl_tasks.tree.scope import ChangeKind, Scope
from fdl_tasks.tree.snapshot import Entry
from fdl_tasks.tree.workspace import package_dirs, survey
from fdl_tasks.watch.lines import (
    build_labels,
    cycle_line,
    describe_changes,
    failed_line,
    stopped_line,
    verified_text,
)
from fdl_tasks.watch.state_files import StateFile, WatchFiles, hold_lock, touch_stamp
from fdl_tasks.watch.watcher import Watcher


class Session:
    """One ``prebuild --watch``: what the last cycle left, and what the next one needs."""

    def __init__(self, run: Run, command: str, crate: str, as_json: bool) -> None:
        #: The next cycle's builds, started in their warm containers after each cycle.
        self.standbys = Standbys(run.c)
        run = attrs.evolve(run, standbys=self.standbys)
        self.run, self.command, self.crate, self.as_json = run, command, crate, as_json
        self.files = WatchFiles(run.root, command)
        self.state_file = StateFile(self.files, run.report)
        self.root = posixpath.normpath(str(run.root))
        self.cycle = 0
        self.last_ok: bool | None = None
        #: What a failed cycle could not remove (a timed-out build's container): exit 3 at the end.
        self.left_running: list[str] = []
        #: The last cycle's stamp (ns), and the files changed at or after it as it saw them.
        self.stamp_ns: int | None = None
        self.seen: dict[str, Entry] = {}
        #: The cluster file changed: re-read it, then preflight again.
        self.reload = False
        self.probe = True
        #: The last preflight's verdicts: a cycle that does not probe plans from their facts
        #: (a host's CPU architecture found by ``uname -m``, above all).
        self.verdicts: tuple[HostVerdict, ...] = ()
        self.target_dirs: list[tuple[str, str | None]] = []
        #: Package name → directories; ``None`` after a manifest changed.
        self.packages: dict[str, list[str]] | None = None
        settings = run.settings
        self.watcher = Watcher(
            run.root,
            self.survey(),
            settings.watch_polling,
            settings.watch_debounce,
            run.report,
            self.write_state,
        )

    def survey(self) -> Scope:
        """The scope now: new variants, packages, build script inputs."""
        if self.packages is None:
            self.packages = package_dirs(self.root)
        return survey(
            self.run,
            self.packages,
            self.target_dirs,
            self.files.directory,
            backend_for(self.run.cluster).mounts(),
        )

    def write_state(self) -> None:
        """Tell launch what the watcher does (called from watcher threads too)."""
        state, queued = self.watcher.status()
        if state == "idle" and self.last_ok is False:
            state = "failed"
        self.state_file.write(
            state, queued, self.cycle, self.stamp_ns, self.seen, self.watcher.scope
        )

    def reload_cluster(self) -> None:
        cluster = load_cluster(self.run.settings.cluster_file, self.run.settings.env or None)
        old = self.run.cluster.controller.path
        if cluster.controller.path != old:
            raise FdlError(
                f"controller.path changed from {old} to {cluster.controller.path}: stop this "
                "watcher (Ctrl-C) and start it again to watch the new tree"
            )
        self.run = attrs.evolve(self.run, cluster=cluster)
        self.reload = False

    def quiet_run(self, lines: list[str]) -> Run:
        """The run with progress kept back (warnings and waits still shown at once)."""
        report = self.run.report

        def keep(line: str, severity: Severity = Severity.PROGRESS, /) -> None:
            if severity is Severity.PROGRESS:
                lines.append(line)
            else:
                report(line, severity)

        return attrs.evolve(self.run, report=keep)

    def run_cycle(self, batch: Mapping[str, ChangeKind]) -> None:
        """One prebuild; a failure is reported and watching goes on."""
        self.cycle += 1
        first = self.cycle == 1
        started = time.monotonic()
        self.stamp_ns = touch_stamp(self.files)
        self.seen = self.watcher.checkpoint(self.stamp_ns)
        self.write_state()
        what = "initial prebuild" if first else describe_changes(batch, self.root)
        if ChangeKind.CLUSTER in batch.values():
            self.reload = True
        if ChangeKind.MANIFEST in batch.values():
            self.packages = None
        lines: list[str] = []
        try:
            if self.reload:
                self.reload_cluster()
                self.probe = True
            run = self.run if first else self.quiet_run(lines)
            with recorded(run, self.command, self.run.report) as run:
                published = pipeline.prebuild(
                    run, self.command, self.crate, probe=self.probe, known=self.verdicts
                )
        except FdlError as exc:
            hand_over(None)
            self.last_ok, self.probe = False, True
            if isinstance(exc, LeftRunning):  # the watch goes on; its exit will say so
                self.left_running.append(str(exc))
            for line in [*lines, str(exc)]:
                for part in line.splitlines():
                    self.run.report(part)
            self.watcher.finish()  # before its last line: a stop after it finds no cycle
            self.run.report(failed_line(self.cycle, time.monotonic() - started, what))
            return
        probed, self.last_ok, self.probe = self.probe and not first, True, False
        if published is None:  # --dry
            self.watcher.finish()
            return
        hand_over(published.text)
        self.verdicts = published.verdicts
        results = published.results
        self.target_dirs = target_dirs(r.job for r in results)
        rebuilt = build_labels([r.job.build for r in results if r.rebuilt])
        fresh = sum(1 for r in results if not r.rebuilt)
        verified = verified_text(published.verification)
        seconds = time.monotonic() - started
        self.watcher.finish()
        self.run.report(cycle_line(self.cycle, seconds, what, rebuilt, fresh, verified, probed))
        if self.as_json:
            print(published.text, flush=True)

    def serve(self) -> None:
        """The first prebuild, then a cycle per settled batch of changes, until stopped."""
        self.watcher.rewatch()  # before the first build: edits made during it are not lost
        self.run.report(
            f"watch: watching {self.root} for {self.command}'s sources ({self.watcher.how}); "
            "the first cycle is a full prebuild; Ctrl-C stops"
        )
        batch: dict[str, ChangeKind] = {}
        while True:
            self.run_cycle(batch)
            self.watcher.scope = self.survey()
            self.watcher.rewatch(catch_up=True)  # what changed unwatched is pending now
            self.write_state()
            # Once the cycle is over: a save meanwhile is the watcher's, seen once.
            self.standbys.refill()
            batch = self.watcher.next_batch()

    def stopped_message(self) -> str:
        published = published_path(self.run.root, self.command).is_file()
        building = self.watcher.debouncer.building
        return stopped_line(self.command, self.cycle, building, published, self.last_ok is True)

    def close(self) -> None:
        self.standbys.close()
        self.watcher.stop()
        self.state_file.remove()


def watch_and_rebuild(run: Run, command: str, crate: str, *, as_json: bool = False) -> None:
    """``inv prebuild --watch``: a full prebuild, then one cycle per settled change.

    Returns only by :class:`Stopped` (Ctrl-C, SIGTERM; a stopped build raises it
    too); a failed cycle is reported and watching goes on.
    """
    if run.dry:
        run.report("watch: --dry prints the commands of one cycle and does not watch")
        pipeline.prebuild(run, command, crate)
        return
    lock = hold_lock(WatchFiles(run.root, command))
    session: Session | None = None
    try:
        with sigterm_as_interrupt():
            session = Session(run, command, crate, as_json)
            session.serve()
    except (KeyboardInterrupt, Stopped) as exc:
        message = session.stopped_message() if session else "watch stopped before its first cycle"
        left = [str(exc)] if isinstance(exc, StoppedLeftRunning) else []
        left = [*(session.left_running if session else []), *left]
        left += remove_warm(run)  # the watch's warm build containers end with it
        if left:  # not a clean stop: what a cycle or the stop could not remove, exit 3
            raise StoppedLeftRunning("\n".join([message, *left])) from None
        raise Stopped(message) from None
    finally:
        if session is not None:
            session.close()
        lock.close()
