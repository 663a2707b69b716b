"""``watchfiles`` over a :class:`~fdl_tasks.watch.plan.WatchPlan`, and how it watches.

Thin: threads that hand every batch of raw file events on, the file system
questions that sort them (is a new path a directory, what moved in with it),
and the mount table read to choose between inotify and polling.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import watchfiles

from fdl_tasks.watch.plan import WatchPlan
from fdl_tasks.watch.polling import POLL_MS, mount_fstype, polling_choice
from fdl_tasks.watch.scope import Kind, Scope, gone_directory
from fdl_tasks.watch.workspace import walk_files

Changes = set[tuple[watchfiles.Change, str]]
#: watchfiles: a batch ends after this many ms without events, at the latest after _GROUP_MS.
_STEP_MS = 50
_GROUP_MS = 400
#: Files of a directory that appears at once (moved in) examined at most.
_NEW_DIR_FILES = 5000


class FileWatch:
    """A thread for the plan's trees, one for the directories watched alone; every
    batch goes to ``deliver``, a thread's end (not asked for) to ``failed``."""

    def __init__(
        self,
        plan: WatchPlan,
        polling: bool,
        deliver: Callable[[Changes], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self.plan, self.polling = plan, polling
        self._deliver, self._failed = deliver, failed
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._watch, args=(paths, recursive), daemon=True, name="fdl-watch"
            )
            for paths, recursive in ((plan.recursive, True), (plan.flat, False))
            if paths
        ]

    def start(self) -> FileWatch:
        for thread in self._threads:
            thread.start()
        return self

    def _watch(self, paths: Sequence[str], recursive: bool) -> None:
        try:
            for changes in watchfiles.watch(
                *paths,
                watch_filter=None,
                debounce=_GROUP_MS,
                step=_STEP_MS,
                stop_event=self._stop,
                recursive=recursive,
                force_polling=True if self.polling else None,
                poll_delay_ms=POLL_MS,
                raise_interrupt=False,
                ignore_permission_denied=True,
            ):
                self._deliver(changes)
        except Exception as exc:
            if not self._stop.is_set():
                self._failed(exc)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)


def relevant_changes(scope: Scope, changes: Changes) -> tuple[dict[str, Kind], bool]:
    """(the changes that count, whether the watch plan must be made again).

    A directory moved in whole sends one event: the files inside it are looked
    at. A new or removed directory changes what to watch.
    """
    relevant: dict[str, Kind] = {}
    replan = False
    for change, path in changes:
        if change == watchfiles.Change.added and os.path.isdir(path):
            replan = True  # a new directory: moved in whole, or a new top-level one
            if gone_directory(scope, path) is None:
                continue  # a target dir, a cache: nothing in it can count
            for found in walk_files(path, scope.root, _NEW_DIR_FILES):
                kind = scope.classify(found)
                if kind is not None:
                    relevant[found] = kind
            continue
        kind = scope.classify(path)
        if change == watchfiles.Change.deleted:
            replan = True
            kind = kind or gone_directory(scope, path)
        if kind is not None:
            relevant[path] = kind
    return relevant, replan


def how_to_watch(root: Path, forced: bool) -> tuple[bool, str]:
    """Whether to poll (``forced``: ``fdl.watch_polling``), and what to say about it."""
    if forced:
        return polling_choice(root, None, forced)
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        mountinfo = ""
    return polling_choice(root, mount_fstype(mountinfo, os.path.realpath(root)), forced)
