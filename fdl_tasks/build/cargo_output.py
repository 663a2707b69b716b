"""What a cargo build prints, sorted: its progress bar, its status lines, its diagnostics.

Pure: text in, events out. cargo draws its progress bar even through a pipe
when asked (:data:`PROGRESS_FLAGS`, given on its command line so that it
reaches cargo in every build mode); each redraw ends in a carriage return,
so the stream is cut at both ``\\r`` and ``\\n``. A diagnostic (``error: …``,
``warning[E…]: …``) runs from its header to the next header, status line or
bar: cargo writes each one whole, and clears its bar before it.
"""

from __future__ import annotations

import re

import attrs

#: Wide enough that cargo names the crates in flight rather than cutting them.
PROGRESS_WIDTH = 200
#: cargo's own ``Building [==>  ] 23/63: crate`` bar, even with no terminal.
PROGRESS_FLAGS = (
    "--config",
    'term.progress.when="always"',
    "--config",
    f"term.progress.width={PROGRESS_WIDTH}",
)

_BAR = re.compile(r"^\s*Building \[[^\]]*\]\s*(\d+)/(\d+)(?::\s*(.*?))?\s*$")
_STATUS = re.compile(r"^( *)([A-Z][a-z]+) ")
_FINISHED = re.compile(r"^ *Finished ")
_HEADER = re.compile(r"^(error|warning)(\[[A-Za-z0-9_]+\])?:")
#: cargo right-aligns its status verbs (``   Compiling``) to this column.
_STATUS_COLUMN = 12


@attrs.frozen
class Progress:
    """One redraw of cargo's bar: units done out of the total, the crates in flight."""

    done: int
    total: int
    crates: str


@attrs.frozen
class StatusLine:
    """A status line of cargo's (``Compiling x v0.1.0``), for the log and plain output."""

    line: str


@attrs.frozen
class Diagnostic:
    """A warning or an error, header first, as cargo printed it."""

    lines: tuple[str, ...]


@attrs.frozen
class Other:
    """Any other line: a build script's, the container tool's, ours."""

    line: str


Event = Progress | StatusLine | Diagnostic | Other


def is_status(line: str) -> bool:
    """A cargo status line: a capitalised verb right-aligned to column 12."""
    found = _STATUS.match(line)
    return found is not None and len(found[1]) + len(found[2]) == _STATUS_COLUMN


class CargoOutput:
    """One build's stream cut into events; text may arrive in any pieces."""

    def __init__(self) -> None:
        self._pending = ""
        self._block: list[str] = []
        self._total = 0

    def feed(self, text: str) -> list[Event]:
        pieces = re.split(r"(\r\n|\r|\n)", self._pending + text)
        self._pending = pieces.pop()
        events: list[Event] = []
        for piece, end in zip(pieces[::2], pieces[1::2], strict=True):
            events += self._piece(piece, bar_end=end == "\r")
        return events

    def close(self) -> list[Event]:
        """The rest, at the end of the stream (a last line with no newline too)."""
        events = self._piece(self._pending, bar_end=False) if self._pending else []
        self._pending = ""
        return events + self._close_block()

    def _piece(self, piece: str, *, bar_end: bool) -> list[Event]:
        if bar := _BAR.match(piece):
            self._total = int(bar[2])
            return [*self._close_block(), Progress(int(bar[1]), self._total, bar[3] or "")]
        if not piece.strip():
            if self._block and not bar_end:
                self._block.append("")
            return []
        if _HEADER.match(piece):
            closed = self._close_block()
            self._block = [piece]
            return closed
        if is_status(piece):
            # cargo's last bar is one short (the binary links after it): Finished is all done
            finished = _FINISHED.match(piece) and self._total
            done = [Progress(self._total, self._total, "")] if finished else []
            return [*self._close_block(), StatusLine(piece), *done]
        if self._block:
            self._block.append(piece)
            return []
        return [Other(piece)]

    def _close_block(self) -> list[Event]:
        block, self._block = self._block, []
        while block and not block[-1].strip():
            block.pop()
        return [Diagnostic(tuple(block))] if block else []
