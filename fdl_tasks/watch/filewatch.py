"""The file watcher over a :class:`~fdl_tasks.tree.roots.WatchPlan`, and how it watches.

Thin: threads that hand every batch of raw file events on, the file system
questions that sort them (is a new path a directory, what moved in with it),
and the mount table read to choose between inotify and polling.

inotify is ``watchfiles``' (its ``RustNotify``, used directly: it returns once
the watches are in place, which ``watchfiles.watch`` never says). Polling is
ours (:mod:`.scan`, :mod:`.snapshot`): ``watchfiles``' poller compares mtimes
to the second, so a save in the same second as the file's previous write went
unseen for good.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from watchfiles._rust_notify import RustNotify

from fdl_tasks.core.atomic_files import text_or_empty
from fdl_tasks.tree.roots import WatchPlan
from fdl_tasks.tree.scope import ChangeKind, Scope, gone_directory
from fdl_tasks.tree.snapshot import Change, Snapshot, diff, settled
from fdl_tasks.tree.workspace import walk_files
from fdl_tasks.watch.polling import POLL_MS, mount_fstype, polling_choice

Changes = set[tuple[Change, str]]
#: A look at the plan's tree: the last look in (``None``: the first), the new one out.
Look = Callable[[WatchPlan, Snapshot | None], Snapshot]
#: inotify: a batch ends after this many ms without events, at the latest after _GROUP_MS.
_STEP_MS = 20
_GROUP_MS = 400
#: Files of a directory that appears at once (moved in) examined at most.
_NEW_DIR_FILES = 5000
#: How long a new watcher may take to be in place before the old one stops anyway (s).
_READY_TIMEOUT = 30.0


class FileWatch:
    """inotify: a thread for the plan's trees, one for the directories watched alone;
    polling: one thread for both. Every batch goes to ``receive``, a thread's end
    (not asked for) to ``failed``; :meth:`wait_ready` returns once every thread
    watches (the first look taken, or the inotify watches set)."""

    def __init__(
        self,
        plan: WatchPlan,
        polling: bool,
        receive: Callable[[Changes], None],
        failed: Callable[[BaseException], None],
        look: Look,
    ) -> None:
        self.plan, self.polling = plan, polling
        self._receive, self._failed, self._look = receive, failed, look
        self._stop = threading.Event()
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        if polling:
            self._add(self._poll, ())
        else:
            for paths, recursive in ((plan.recursive, True), (plan.flat, False)):
                if paths:
                    self._add(self._notify, (paths, recursive))

    def _add(self, target: Callable[..., None], args: tuple[object, ...]) -> None:
        ready = threading.Event()
        body = (target, (*args, ready), ready)
        thread = threading.Thread(target=self._guarded, args=body, daemon=True, name="fdl-watch")
        self._threads.append((thread, ready))

    def _guarded(
        self, target: Callable[..., None], args: tuple[object, ...], ready: threading.Event
    ) -> None:
        """A thread's body: its end (not asked for) goes to ``failed``, ready set by then."""
        try:
            target(*args)
        except Exception as exc:
            if not self._stop.is_set():
                self._failed(exc)
        finally:
            ready.set()

    def start(self) -> FileWatch:
        for thread, _ in self._threads:
            thread.start()
        return self

    def wait_ready(self) -> None:
        for _, ready in self._threads:
            ready.wait(_READY_TIMEOUT)

    def _notify(self, paths: Sequence[str], recursive: bool, ready: threading.Event) -> None:
        with RustNotify(list(paths), False, False, POLL_MS, recursive, True) as notify:
            ready.set()
            while not self._stop.is_set():
                raw = notify.watch(_GROUP_MS, _STEP_MS, 1000, self._stop)
                if raw == "stop":
                    return
                if isinstance(raw, set) and raw:
                    self._receive({(Change(c), path) for c, path in raw})

    def _poll(self, ready: threading.Event) -> None:
        last = settled(self._look(self.plan, None))
        ready.set()
        while not self._stop.wait(POLL_MS / 1000):
            now = self._look(self.plan, last)
            changes = diff(last, now)
            last = settled(now)
            if changes:
                self._receive(changes)

    def stop(self) -> None:
        self._stop.set()
        for thread, _ in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)


def relevant_changes(scope: Scope, changes: Changes) -> tuple[dict[str, ChangeKind], bool, bool]:
    """(the changes that count, whether the watch plan must be made again, whether one
    of them is a removal: an editor saving by rename, a checkout, mid-way).

    A directory moved in whole sends one event: the files inside it are looked
    at. A new or removed directory changes what to watch.
    """
    relevant: dict[str, ChangeKind] = {}
    replan = removal = False
    for change, path in changes:
        if change == Change.added and os.path.isdir(path):
            replan = True  # a new directory: moved in whole, or a new top-level one
            if gone_directory(scope, path) is None:
                continue  # a target dir, a cache: nothing in it can count
            for found in itertools.islice(walk_files(path, scope.root), _NEW_DIR_FILES):
                if (kind := scope.classify(found)) is not None:
                    relevant[found] = kind
            continue
        kind = scope.classify(path)
        if change == Change.deleted:
            replan = True
            kind = kind or gone_directory(scope, path)
            removal = removal or kind is not None
        if kind is not None:
            relevant[path] = kind
    return relevant, replan, removal


def how_to_watch(root: Path, forced: bool) -> tuple[bool, str]:
    """Whether to poll (``forced``: ``fdl.watch_polling``), and what to say about it."""
    if forced:
        return polling_choice(root, None, forced)
    mountinfo = text_or_empty("/proc/self/mountinfo")
    return polling_choice(root, mount_fstype(mountinfo, os.path.realpath(root)), forced)
