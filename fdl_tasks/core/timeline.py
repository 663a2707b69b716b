"""A run's timeline for ``--timings``: spans with monotonic start and end, nothing else.

Pure logic (the clock is passed in). One :class:`Timeline` rides on the run
(:attr:`fdl_tasks.config.run.Run.timeline`); each step adds its spans, from
whichever thread it runs in, and :meth:`Timeline.data` is what the page
(:mod:`fdl_tasks.timings.timings_html`) embeds and draws.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

#: The steps of a run, in the order they happen and are drawn.
KINDS = ("preflight", "build", "verify", "publish")


@attrs.frozen(kw_only=True)
class Span:
    """One step for one host or build environment: seconds on the timeline's clock."""

    kind: str
    name: str
    start: float
    end: float
    ok: bool = True
    hosts: tuple[str, ...] = ()
    #: The build's own cargo ``--timings`` report, relative to the page.
    link: str | None = None


class Timeline:
    """The spans of one run (or one watch cycle); safe to add to from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.origin = clock()
        self.ended: float | None = None
        self.mode = ""
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, kind: str, name: str, start: float, end: float, **extra: Any) -> None:
        """A span measured elsewhere, on the same clock."""
        with self._lock:
            self._spans.append(Span(kind=kind, name=name, start=start, end=end, **extra))

    @contextmanager
    def span(self, kind: str, name: str) -> Iterator[None]:
        """Time the block; a block that raised is a span that did not end well."""
        start, ok = self.clock(), False
        try:
            yield
            ok = True
        finally:
            self.add(kind, name, start, self.clock(), ok=ok)

    def finish(self) -> None:
        """The run's end: its wall time is fixed from here on."""
        if self.ended is None:
            self.ended = self.clock()

    @property
    def spans(self) -> list[Span]:
        with self._lock:
            return sorted(self._spans, key=lambda s: (KINDS.index(s.kind), s.start, s.name))

    def data(self, **about: object) -> dict[str, object]:
        """What the page embeds: seconds from the run's start, and ``about`` as given."""
        end = self.ended if self.ended is not None else self.clock()
        return {
            **about,
            "mode": self.mode,
            "wall": round(end - self.origin, 6),
            "spans": [
                {
                    "kind": s.kind,
                    "name": s.name,
                    "start": round(s.start - self.origin, 6),
                    "end": round(s.end - self.origin, 6),
                    "seconds": round(s.end - s.start, 6),
                    "ok": s.ok,
                    "hosts": list(s.hosts),
                    "link": s.link,
                }
                for s in self.spans
            ],
        }


def fold_rounds(
    rounds: Iterable[tuple[str, float, float, bool]],
) -> dict[str, tuple[float, float, bool]]:
    """Round trips (host, start, end, ok) as one span per host: first start to last end.

    Verification retries a host whose mount lags; its span covers every try,
    and it ended well if its last try did.
    """
    folded: dict[str, tuple[float, float, bool]] = {}
    for host, start, end, ok in rounds:
        first = folded.get(host, (start, end, ok))[0]
        folded[host] = (min(first, start), end, ok)
    return folded
