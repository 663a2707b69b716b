"""The one ``flock`` helper: the project lock, ``clean``'s, the watcher's and the
``known_hosts`` appends use it.

A lock file is opened once and held by its open stream; taking it never blocks
unless asked to, so each caller decides what a busy lock means (wait, refuse,
poll). The holder of a lock file writes ``pid N`` into it, for the message of
whoever finds it busy; a data file locked while it is appended to (``known_hosts``)
is opened by its user, in binary, and locked as it is. Where no lock can be taken
(a watcher's state file, read from a process it does not share a lock with), the
pid it names is asked whether it still runs (:func:`process_running`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, AnyStr, Generic, Self

from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, Severity


class FileLock(Generic[AnyStr]):
    """An open file, locked with ``flock`` (text for a lock file, binary for a data
    file); closing it releases the lock."""

    def __init__(self, path: Path, stream: IO[AnyStr]) -> None:
        self.path = path
        self.stream: IO[AnyStr] = stream

    @classmethod
    def create(cls, path: Path) -> FileLock[str]:
        """Open ``path`` for locking, made with its directory if missing (``OSError`` if not)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(path, path.open("a+"))

    @classmethod
    def existing(cls, path: Path) -> FileLock[str] | None:
        """Open ``path`` for locking only if it is there (``None`` when it cannot be read)."""
        try:
            return FileLock(path, path.open("r"))
        except OSError:
            return None

    def take(self, *, shared: bool = False, wait: bool = False) -> bool:
        """Take the lock; ``False`` when another process holds it and ``wait`` is off.
        ``OSError`` means this file system has no locks."""
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.stream, flags)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self.stream, fcntl.LOCK_UN)

    def holder(self: FileLock[str]) -> str:
        """What the holder wrote about itself, else ``another process``."""
        with contextlib.suppress(OSError):
            self.stream.seek(0)
            return self.stream.read().strip() or "another process"
        return "another process"

    def claim(self: FileLock[str]) -> None:
        """Write ``pid N`` (a courtesy for messages: a full disk may refuse it)."""
        with contextlib.suppress(OSError):
            self.stream.seek(0)
            self.stream.truncate()
            self.stream.write(f"pid {os.getpid()}\n")
            self.stream.flush()

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def create_lock(path: Path) -> FileLock[str]:
    """:meth:`FileLock.create`, a failure said as the target tree not being writable."""
    try:
        return FileLock.create(path)
    except OSError as exc:
        raise FdlError(f"the target tree is not writable: cannot create {path} ({exc})") from None


@contextlib.contextmanager
def project_lock(path: Path, report: Report) -> Iterator[None]:
    """One prebuild per project tree at a time; a second one waits its turn, saying so."""
    with create_lock(path) as lock:
        if not lock.take():
            report(
                f"prebuild: waiting for the prebuild already running on this project "
                f"({lock.holder()}) to finish",
                Severity.WAIT,
            )
            lock.take(wait=True)
        lock.claim()
        yield


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
