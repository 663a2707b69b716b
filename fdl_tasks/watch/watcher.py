"""File events into batches: the side of a watch session that watcher threads run.

Watcher threads sort each batch of events (:func:`relevant_changes`) into the
:class:`~fdl_tasks.watch.debounce.Debouncer`; the session's thread waits for
a due batch (:meth:`Watcher.next_batch`), and meanwhile watches again when
the tree's directories changed or a watcher thread died.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fdl_tasks.reporting import Report
from fdl_tasks.watch.debounce import Debouncer
from fdl_tasks.watch.filewatch import Changes, FileWatch, how_to_watch, relevant_changes
from fdl_tasks.watch.plan import WatchPlan, watch_plan
from fdl_tasks.watch.polling import POLL_MS
from fdl_tasks.watch.scope import Kind, Scope


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

    def plan(self) -> WatchPlan:
        root = self.scope.root
        try:
            tops = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            tops = []
        return watch_plan(self.scope, tops, os.path.exists)

    def rewatch(self) -> None:
        """Watch what the plan says now; the new watcher starts before the old one stops,
        so no change falls between them."""
        plan = self.plan()
        if self.watch is not None and self.watch.plan == plan:
            return
        old, self.watch = self.watch, FileWatch(plan, self.polling, self.deliver, self.failed)
        self.watch.start()
        if old is not None:
            old.stop()

    def deliver(self, changes: Changes) -> None:
        """A watcher thread's batch: what counts joins the pending batch."""
        relevant, replan = relevant_changes(self.scope, changes)
        with self.cv:
            self.debouncer.add(relevant, time.monotonic())
            self.replan = self.replan or replan
            self.cv.notify_all()
        if relevant:
            self.changed()

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
        self.watch, old = None, self.watch
        if old is not None:
            old.stop()
        self._restarts += 1
        time.sleep(min(0.5 * 2 ** min(self._restarts, 5), 10.0))
        self.rewatch()

    def next_batch(self) -> dict[str, Kind]:
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
