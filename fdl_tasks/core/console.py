"""What a user watches: build output prefixed by build, a live status line, tables.

On a terminal the last line shows what is running, redrawn twice a second;
in a pipe or CI log there are plain lines instead.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Protocol, TextIO


class TextSink(Protocol):
    """Anything build output can be written to: a file, a terminal, the status board."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class StatusBoard:
    """Where build output goes: plain lines, plus a live status line on a terminal.

    On a TTY the last line shows what is running (with elapsed time), done and
    failed, redrawn every half second; elsewhere (CI logs) only plain lines.
    """

    def __init__(
        self, stream: TextIO = sys.stderr, live: bool | None = None, label: str = "prebuild"
    ) -> None:
        self.stream, self.label = stream, label
        self.live = stream.isatty() if live is None else live
        self.lock = threading.Lock()
        self.running: dict[str, float] = {}
        self.done = self.failed = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(("\r\033[K" if self.live else "") + text)
            self._draw()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def started(self, name: str) -> None:
        with self.lock:
            self.running[name] = time.monotonic()
        if not self.live:
            self.write(f"{self.label}: {name} started\n")

    def finished(
        self, name: str, *, ok: bool, seconds: float, detail: str = "", stopped: bool = False
    ) -> None:
        """A build's end: ok (with a note), FAILED with why, or ``stopped`` (by the user:
        no failure)."""
        with self.lock:
            self.running.pop(name, None)
            if ok:
                self.done += 1
            elif not stopped:
                self.failed += 1
        if ok:
            state = f"ok ({detail})" if detail else "ok"
        else:
            state = "stopped" if stopped else f"FAILED ({detail})"
        self.write(f"{self.label}: {name} {state} in {seconds:.1f}s\n")

    def _draw(self) -> None:
        if not self.live:
            return
        now = time.monotonic()
        running = ", ".join(f"{n} {now - t:.0f}s" for n, t in self.running.items())
        self.stream.write(
            f"\r\033[K[running: {running or '-'} | done {self.done} | failed {self.failed}]"
        )
        self.stream.flush()

    def __enter__(self) -> StatusBoard:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self.lock:
                self._draw()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.live:
            with self.lock:
                self.stream.write("\r\033[K")
                self.stream.flush()


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
