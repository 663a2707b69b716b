"""Interrupts: SIGTERM stops a run exactly the way Ctrl-C does, when fdl-tasks is the program.

Signal handlers belong to the program, and only its main thread may set them
(:func:`signal.signal` raises anywhere else). So the tasks say that they run as
the program (:func:`as_program`, around each task's body) and the steps take
SIGTERM over only then, on the main thread: a project calling
:mod:`fdl_tasks.api` keeps its own handlers, from any thread. A flag in a
:class:`~contextvars.ContextVar`, not a global: it holds for the task's own
thread alone, and is reset however the task ends.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from types import FrameType

#: What a foreground program is passed on: a stop (Ctrl-C, TERM) or the terminal's hang-up.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_AS_PROGRAM: ContextVar[bool] = ContextVar("fdl_tasks_as_program", default=False)


@contextlib.contextmanager
def as_program() -> Iterator[None]:
    """Inside: a task runs, so fdl-tasks is the program and may take SIGTERM over."""
    token = _AS_PROGRAM.set(True)
    try:
        yield
    finally:
        _AS_PROGRAM.reset(token)


def owns_signals() -> bool:
    """Whether this code may set signal handlers: a task's, on the main thread."""
    return _AS_PROGRAM.get() and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _handling(
    signums: Iterable[int], handler: Callable[[int, FrameType | None], object]
) -> Iterator[None]:
    """Inside: ``handler`` takes each of ``signums``, the previous handlers restored after;
    outside a task's main thread (:func:`owns_signals`) the signals stay the program's."""
    if not owns_signals():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, earlier in previous.items():
            signal.signal(signum, earlier)


def sigterm_as_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGTERM stops a prebuild exactly like Ctrl-C does; outside a task's main thread,
    SIGTERM stays the program's (:func:`owns_signals`)."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return _handling((signal.SIGTERM,), interrupt)


def forwarding_signals(process: subprocess.Popen[bytes]) -> contextlib.AbstractContextManager[None]:
    """Each stop this process gets is passed on to ``process``, once (it runs in a process
    group of its own, so the terminal's Ctrl-C reaches it only through here); the program
    decides how to stop. Outside a task's main thread (:func:`owns_signals`), nothing is."""
    return _handling(FORWARDED, lambda signum, _frame: process.send_signal(signum))
