"""How a run says what it does: one line at a time, each with a severity.

A watch cycle holds progress back (it prints one status line instead) but
shows warnings and waits at once; the severity says which is which, so no
one reads a line's words to decide.
"""

from __future__ import annotations

import enum
import sys
from typing import Protocol


class Severity(enum.Enum):
    #: What a run is doing; a quiet watch cycle keeps it back.
    PROGRESS = "progress"
    #: Something the user should know now (a host unreachable, a cache off, a loose file).
    WARNING = "warning"
    #: The run is waiting for something (another prebuild's lock, a watcher's cycle).
    WAIT = "wait"


class Report(Protocol):
    """Where a run's lines go."""

    def __call__(self, line: str, severity: Severity = Severity.PROGRESS, /) -> None: ...


def report_to_stderr(line: str, severity: Severity = Severity.PROGRESS, /) -> None:
    """Progress and diagnostics go to stderr; stdout is for what ``--json`` asks for.

    One write per line: builds report from their own threads, and ``print`` writes
    the newline apart, where another thread's line could come between."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def collect(lines: list[str]) -> Report:
    """A reporter appending each line to ``lines`` (what a quiet cycle or a test keeps)."""

    def append(line: str, severity: Severity = Severity.PROGRESS, /) -> None:
        lines.append(line)

    return append
