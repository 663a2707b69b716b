"""Interrupts: SIGTERM stops a run exactly the way Ctrl-C does."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from types import FrameType

#: What a foreground program is passed on: a stop (Ctrl-C, TERM) or the terminal's hang-up.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a prebuild exactly like Ctrl-C does."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def forwarding_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """Each stop this process gets is passed on to ``process``, once (it runs in a process
    group of its own, so the terminal's Ctrl-C reaches it only through here); the program
    decides how to stop. Off the main thread no handler can be set: nothing is forwarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, _frame: FrameType | None) -> None:
        process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
