"""File events into batches: the side of a watch session that watcher threads run.

Watcher threads sort each batch of events (:func:`relevant_changes`) into the
:class:`~fdl_tasks.watch.debounce.Debouncer`; the session's thread waits for
a due batch (:meth:`Watcher.next_batch`), and meanwhile watches again when
the tree's directories changed or a watcher thread died.

No change may fall between two watchers, or between a cycle and the watcher:
a new watcher's first look and an old one's unsent batch, inotify watches set
a moment after their thread starts, a thread that died. Rather than reason
about each gap, each cycle starts with a look at the tree (:meth:`Watcher.checkpoint`,
with the racy-content rule of :mod:`.snapshot`), and after the cycle, and after
every new watcher is in place, the tree is compared with it
(:meth:`Watcher.catch_up`): whatever differs from what the cycle started from
joins the pending batch. That holds whatever a watcher missed, so it holds in
both modes; a change the watcher also saw is merely named twice.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fdl_tasks.core.reporting import Report
from fdl_tasks.tree.roots import WatchPlan, watch_plan
from fdl_tasks.tree.scan import digest, entry_of, scan
from fdl_tasks.tree.scope import ChangeKind, Scope
from fdl_tasks.tree.snapshot import Entry, Snapshot, changed_since, diff
from fdl_tasks.watch.debounce import Debouncer
from fdl_tasks.watch.filewatch import Changes, FileWatch, how_to_watch, relevant_changes
from fdl_tasks.watch.polling import POLL_MS


class Watcher:
    """What is watched (``scope``, set anew after every cycle), how, and the pending batch.

    ``changed`` is called (from a watcher thread) when a change joined the batch.
    """

    def __init__(
        self,
        root: Path,
        scope: Scope,
        forced_polling: bool,
        debounce: float,
        report: Report,
        changed: Callable[[], None],
    ) -> None:
        self.scope, self.report, self.changed = scope, report, changed
        self.polling, self.how = how_to_watch(root, forced_polling)
        self.debouncer = Debouncer.for_watch(debounce, self.polling)
        self.cv = threading.Condition()
        self.watch: FileWatch | None = None
        self.replan = False
        self.failures: list[BaseException] = []
        self._said: set[str] = set()
        self._restarts = 0
        #: The look the last cycle started from, and the file system's clock then.
        self.baseline: Snapshot | None = None
        self.stamp_ns: int | None = None
        #: The file system's clock minus this host's (ns), measured at each cycle start.
        self.offset_ns = 0

    def plan(self) -> WatchPlan:
        try:
            tops = [e.name for e in os.scandir(self.scope.root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            tops = []
        return watch_plan(self.scope, tops, os.path.exists)

    def look(self, plan: WatchPlan, previous: Snapshot | None) -> Snapshot:
        """The plan's tree now, with the current scope (called from poller threads too)."""
        return scan(plan, self.scope, previous, time.time_ns() + self.offset_ns)

    def rewatch(self, catch_up: bool = False) -> None:
        """Watch what the plan says now. The new watcher is in place before the old one
        stops; then (and with ``catch_up``) the tree is compared with the cycle's start."""
        plan = self.plan()
        if self.watch is None or self.watch.plan != plan:
            new = FileWatch(plan, self.polling, self.receive, self.failed, self.look)
            old, self.watch = self.watch, new.start()
            new.wait_ready()
            if old is not None:
                old.stop()
            catch_up = True
        if catch_up:
            self.catch_up()

    def checkpoint(self, stamp_ns: int | None) -> dict[str, Entry]:
        """A cycle starts (``stamp_ns``: the file system's clock, ``None`` unknown): the
        look it starts from, and the files changed at or after the stamp as it saw them
        (launch compares those: a change at the stamp's own tick may be before or after)."""
        if stamp_ns is not None:
            self.offset_ns = stamp_ns - time.time_ns()
        plan = self.watch.plan if self.watch is not None else self.plan()
        self.baseline, self.stamp_ns = self.look(plan, None), stamp_ns
        if stamp_ns is None:
            return {}
        changed = changed_since(self.baseline, stamp_ns)
        return {p: e for p, e in changed.items() if self.scope.classify(p) is not None}

    def catch_up(self) -> None:
        """What differs from the cycle's starting look joins the pending batch."""
        if self.baseline is None or self.watch is None:
            return
        now = self.look(self.watch.plan, self.baseline)
        if changes := diff(self.baseline, now, self.stamp_ns):
            self.receive(changes)

    def receive(self, changes: Changes) -> None:
        """A watcher thread's batch: what counts joins the pending batch, but for a path
        that is as the last cycle's starting look saw it (:meth:`as_started`)."""
        changes = {(change, path) for change, path in changes if not self.as_started(path)}
        relevant, replan, removal = relevant_changes(self.scope, changes)
        with self.cv:
            self.debouncer.add(relevant, time.monotonic(), settle=removal)
            self.replan = self.replan or replan
            self.cv.notify_all()
        if relevant:
            self.changed()

    def as_started(self, path: str) -> bool:
        """Whether ``path`` is now as the running (or last) cycle's starting look saw it.
        inotify may deliver a save after catch-up put it in the next cycle and that cycle
        started: the cycle has it, so it is no change (it would start one more, building
        nothing). The same stat, and for a stat the look found racy the same content, as
        the look's own rule decides; no clock is compared. Unsure (a path the look did
        not cover or did not see, a stat or content that differs) is a change."""
        baseline = self.baseline  # one reference: a new cycle may replace it meanwhile
        if baseline is None or not baseline.covers(path):
            return False
        before = baseline.entries.get(path)
        try:
            now = entry_of(os.stat(path))
        except FileNotFoundError:
            return before is None
        except OSError:
            return False
        if before is None or not before.same_stat(now):
            return False
        return before.digest is None or digest(path) == before.digest

    def failed(self, error: BaseException) -> None:
        with self.cv:
            self.failures.append(error)
            self.cv.notify_all()

    def recover(self) -> None:
        """A watcher thread died: watch again; out of inotify watches, poll instead."""
        with self.cv:
            failures, self.failures = self.failures, []
        for error in failures:
            text = str(error) or type(error).__name__
            if not self.polling and ("limit" in text.lower() or "No space" in text):
                self.polling = True
                self.how = f"polling every {POLL_MS / 1000:g}s (inotify: {text})"
                self.report(f"watch: inotify gave up ({text}); polling instead")
            elif text not in self._said:
                self.report(f"watch: the file watcher stopped ({text}); watching again")
            self._said.add(text)
        self.stop()
        self.watch = None
        self._restarts += 1
        time.sleep(min(0.5 * 2 ** min(self._restarts, 5), 10.0))
        self.rewatch()

    def next_batch(self) -> dict[str, ChangeKind]:
        """Wait until the pending batch is due (handling watcher restarts meanwhile)."""
        while True:
            with self.cv:
                now = time.monotonic()
                if self.debouncer.due(now):
                    return self.debouncer.start()
                if not (self.replan or self.failures):
                    due = self.debouncer.due_at()
                    self.cv.wait(timeout=5.0 if due is None else max(0.0, due - now))
                    continue
                replan, self.replan = self.replan, False
            if self.failures:
                self.recover()
            elif replan:
                self.rewatch()

    def finish(self) -> None:
        """The cycle ended: what changed meanwhile may start the next."""
        with self.cv:
            self.debouncer.finish()

    def status(self) -> tuple[str, bool]:
        """The debouncer's state (``idle``, ``pending``, ``building``) and whether a
        change waits for the next cycle."""
        with self.cv:
            return self.debouncer.state, self.debouncer.queued

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
