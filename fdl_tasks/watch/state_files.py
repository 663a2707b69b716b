"""The watcher's files under ``target/cluster/_watch/``: its state, its lock, its clock.

``inv launch`` runs in another process, maybe on another host of the shared
mount: these files are all it knows of the watcher. The state says what the
watcher does (written atomically); the lock, held for the watcher's life,
says whether it still lives; the stamp's mtime is the file system's clock
when a cycle started, comparable with the sources' mtimes and ctimes, to the
nanosecond.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from fdl_tasks.config.layout import WATCH_DIR
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.locks import FileLock, create_lock, process_running
from fdl_tasks.core.reporting import Report, Severity
from fdl_tasks.tree.scope import Scope
from fdl_tasks.tree.snapshot import Entry


@attrs.frozen
class WatchFiles:
    """The paths of one command's watcher."""

    root: Path
    command: str

    @property
    def directory(self) -> Path:
        return self.root / WATCH_DIR

    @property
    def state(self) -> Path:
        return self.directory / f"{self.command}.json"

    @property
    def lock(self) -> Path:
        return self.directory / f"{self.command}.lock"

    @property
    def stamp(self) -> Path:
        """Touched when a cycle starts: its mtime is the file system's clock then."""
        return self.directory / f"{self.command}.stamp"


def read_state(path: Path) -> dict[str, Any] | None:
    """The state a watcher wrote, or ``None`` (no watcher, or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class StateFile:
    """The watcher's state file: rewritten only when it changes (watcher threads and
    the cycle write it), a failure to write warned about once."""

    def __init__(self, files: WatchFiles, report: Report) -> None:
        self.files, self.report = files, report
        self._lock = threading.Lock()
        self._written = ""
        self._failed = False

    def write(
        self,
        state: str,
        queued: bool,
        cycle: int,
        stamp_ns: int | None,
        seen: Mapping[str, Entry],
        scope: Scope,
    ) -> None:
        """What the watcher does: ``state`` is ``idle``, ``pending``, ``building`` or
        ``failed`` (idle after a failed cycle); ``stamp_ns``: the last cycle's stamp;
        ``seen``: the files changed at or after it, as the cycle saw them."""
        data = {
            "version": 2,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.files.command,
            "state": state,
            "queued": queued,
            "cycle": cycle,
            "stamp_ns": stamp_ns,
            "seen": {path: entry.to_json() for path, entry in sorted(seen.items())},
            "scope": scope.to_json(),
        }
        text = json.dumps(data, sort_keys=True)
        with self._lock:
            if text == self._written:
                return
            try:
                write_atomically(self.files.state, text + "\n")
                self._written = text
            except FdlError as exc:
                if not self._failed:
                    self._failed = True
                    self.report(
                        f"watch: warning: {exc}; inv launch cannot wait for cycles",
                        Severity.WARNING,
                    )

    def remove(self) -> None:
        """The state and any partial copy: a watcher that ended leaves nothing to wait for."""
        partials = self.files.directory.glob(f".{self.files.state.name}.*.partial")
        for path in [self.files.state, *partials]:
            with contextlib.suppress(OSError):
                path.unlink()


def touch_stamp(files: WatchFiles) -> int | None:
    """The file system's time now, in ns (its clock sets the sources' times too): the
    stamp's mtime, which launch holds each change against."""
    try:
        files.stamp.touch()
        os.utime(files.stamp, None)
        return files.stamp.stat().st_mtime_ns
    except OSError:
        return None


def hold_lock(files: WatchFiles) -> FileLock[str]:
    """The watcher's lock, held for its lifetime: launch tells a live watcher by it."""
    lock = create_lock(files.lock)
    deadline = time.monotonic() + 2.0  # a launch may hold it shared for an instant
    while True:
        try:
            if lock.take():
                return lock
        except OSError:
            return lock  # no locks on this file system: launch falls back to the pid
        if time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        lock.close()
        holder = read_state(files.state) or {}
        raise FdlError(
            f"a prebuild watcher for {files.command} already runs on this project "
            f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}); stop it first"
        )


def watcher_alive(files: WatchFiles, state: Mapping[str, Any]) -> bool:
    """The watcher holds its lock while it lives (the pid where locks do not work)."""
    lock = FileLock.existing(files.lock)
    if lock is None:
        return _pid_alive(state)
    with lock:
        try:
            if not lock.take(shared=True):
                return True
        except OSError:
            return _pid_alive(state)
        lock.release()
        return False


def _pid_alive(state: Mapping[str, Any]) -> bool:
    """Without file locks: the pid, when the watcher runs on this host (a watcher on
    another host cannot be asked: it counts as alive, and the wait is bounded)."""
    if state.get("host") != socket.gethostname():
        return True
    pid = state.get("pid")
    return isinstance(pid, int) and pid > 0 and process_running(pid)
