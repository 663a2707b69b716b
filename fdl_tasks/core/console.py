"""What a user watches: live build progress on a terminal, plain lines elsewhere; tables.

The live region is rich's (``rich.progress.Progress`` under ``rich.live``): it
keeps to the terminal's width, redraws on resize, prints what is said while it
runs above itself and erases itself at the end; this module writes no escape
code of its own. In a pipe, a CI log or with ``--plain`` there are plain lines
only, and one progress line per running build every few seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TextIO

import attrs

if TYPE_CHECKING:  # rich is imported only for a live region (a terminal): 20 ms otherwise
    from rich.progress import Progress, TaskID


class TextSink(Protocol):
    """Anything output can be written to: a file, a terminal, a prefixing stream."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def clock(seconds: float, expected: float | None = None) -> str:
    """``12 s``, with ``~28 s left`` when a last run's time says how long it takes."""
    text = f"{seconds:.0f} s"
    if expected is not None and expected > seconds:
        text += f", ~{expected - seconds:.0f} s left"
    return text


def units(done: int, total: int | None) -> str:
    """``23/63 units`` once the total is known (cargo's first bar), else nothing."""
    return f"{done}/{total} units" if total else ""


@attrs.define
class _Row:
    name: str
    started: float
    expected: float | None
    task: TaskID | None = None
    done: int = 0
    total: int | None = None


class StatusBoard:
    """Where running things show: one live line each on a terminal, else plain lines.

    ``live`` defaults to whether ``stream`` is a terminal; ``every`` is how often, in
    seconds, plain output says each running thing's progress. What is printed while
    the live region runs (this board's :meth:`say`, or anything written to
    ``sys.stderr``) shows above it.
    """

    def __init__(
        self, stream: TextIO | None = None, live: bool | None = None, every: float = 5.0
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self.every = every
        self._lock = threading.Lock()
        self._rows: dict[str, _Row] = {}
        self._progress: Progress | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def say(self, line: str) -> None:
        """A line above the live region (or the next plain line)."""
        if self._progress is not None:
            self._progress.console.out(line, highlight=False)
            return
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def started(
        self, key: str, title: str, *, name: str = "", expected: float | None = None
    ) -> None:
        """``key`` runs from now: ``title`` on its live line, ``name`` in its plain
        progress lines (``title`` by default), ``expected`` seconds from its last run."""
        row = _Row(name or title, time.monotonic(), expected)
        if self._progress is not None:
            row.task = self._progress.add_task(title, total=None, current="", expected=expected)
        with self._lock:
            self._rows[key] = row

    def progress(self, key: str, done: int, total: int, current: str) -> None:
        """``done`` units out of ``total``, ``current`` what is in flight."""
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                return
            row.done, row.total = done, total
        if self._progress is not None and row.task is not None:
            self._progress.update(row.task, completed=done, total=total, current=current)
            if done == total:  # drawn before the line gives way to the result
                self._progress.refresh()

    def finished(self, key: str) -> None:
        """``key`` ended: its live line goes (its result is the caller's to say)."""
        with self._lock:
            row = self._rows.pop(key, None)
        if self._progress is not None and row is not None and row.task is not None:
            self._progress.remove_task(row.task)
            self._progress.refresh()  # gone before the result line is printed above

    def __enter__(self) -> StatusBoard:
        if self.live:
            from fdl_tasks.core.live_region import live_progress

            self._progress = live_progress(self.stream)
            self._progress.start()
        else:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            now = time.monotonic()
            with self._lock:
                rows = list(self._rows.values())
            for row in rows:
                said = [units(row.done, row.total), clock(now - row.started, row.expected)]
                self.say(f"{row.name}: " + ", ".join(filter(None, said)))

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class PrefixedLines:
    """A stream for ``c.run``: text to the log file if any, ``[name] line`` to ``echo``."""

    def __init__(self, name: str, log: TextSink | None, echo: TextSink) -> None:
        self.name, self.log, self.echo, self._pending = name, log, echo, ""

    def write(self, text: str) -> int:
        if self.log:
            self.log.write(text)
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            self.echo.write("".join(f"[{self.name}] {line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.log:
            self.log.flush()
        self.echo.flush()

    def close_line(self) -> None:
        if self._pending:
            self.write("\n")


def format_table(rows: Sequence[Sequence[str]], rule: bool = False) -> list[str]:
    """Columns padded to their widest cell; ``rule`` underlines the header with dashes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def listed(items: Sequence[object], limit: int = 10) -> str:
    """``a, b, c``; past ``limit`` items, the first ones ``and N more``."""
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
