"""SIGTERM as Ctrl-C: the tasks' (the program's), on the main thread only; never the API's."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from fdl_tasks.core.interrupts import as_program, owns_signals, sigterm_as_interrupt


def test_a_task_on_the_main_thread_takes_sigterm_as_ctrl_c() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with as_program(), pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_a_task_sigterm_stays_the_program_s() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt():
        assert signal.getsignal(signal.SIGTERM) is before
    assert not owns_signals()


def test_a_task_off_the_main_thread_sets_no_handler() -> None:
    seen: list[object] = []

    def work() -> None:
        with as_program(), sigterm_as_interrupt():  # signal.signal would raise ValueError
            seen.append(owns_signals())

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [False]
