"""When to start a cycle: the debounce and coalescing state machine.

Pure, with the time passed in, so a whole editing session can be simulated
in a test without sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from fdl_tasks.tree.scope import ChangeKind
from fdl_tasks.watch.polling import POLL_MS

#: A burst of changes never delays a cycle longer than this many debounce periods.
LONGEST_FACTOR = 10


@attrs.define
class Debouncer:
    """Changes collect into one pending batch, never started while a cycle builds:
    what changes then becomes exactly one batch, due after it.

    A change after ``quiet`` seconds of calm (a lone save) is due at once: waiting
    out a debounce would only delay the build it is sure to need. Any other batch
    (the rest of a burst, what was saved during a cycle, one that begins with a
    removal: an editor saving by rename, a checkout, half done) is due once
    nothing has changed for ``quiet`` seconds, or ``longest`` after its first
    change, so a steady trickle cannot starve the build.
    """

    quiet: float
    longest: float
    building: bool = False
    changes: dict[str, ChangeKind] = attrs.field(factory=dict)
    first: float | None = None
    last: float | None = None
    #: The newest change of any batch, and whether the pending batch began after calm.
    latest: float | None = None
    at_once: bool = False

    @classmethod
    def for_watch(cls, debounce: float, polling: bool) -> Debouncer:
        """A watcher's, building its first cycle: ``debounce`` is ``fdl.watch_debounce``;
        polling sees a save only at its next walk, so a burst spans more than one walk."""
        quiet = max(debounce, 1.5 * POLL_MS / 1000) if polling else debounce
        return cls(quiet, LONGEST_FACTOR * quiet, building=True)

    def add(self, changes: Mapping[str, ChangeKind], now: float, settle: bool = False) -> None:
        """``settle``: these changes include a removal, so the batch waits to be quiet."""
        if not changes:
            return
        self.changes.update(changes)
        if self.first is None:
            self.first = now
            calm = self.latest is None or now - self.latest >= self.quiet
            self.at_once = calm and not self.building and not settle
        self.last = self.latest = now

    def due_at(self) -> float | None:
        """When the pending batch starts (``None``: nothing pending, or a cycle builds)."""
        if self.building or self.first is None or self.last is None:
            return None
        if self.at_once:
            return self.first
        return min(self.last + self.quiet, self.first + self.longest)

    def due(self, now: float) -> bool:
        due = self.due_at()
        return due is not None and now >= due

    def start(self) -> dict[str, ChangeKind]:
        """A cycle starts: it takes the pending batch."""
        if self.building:
            raise RuntimeError("a cycle is already building")
        batch, self.changes = self.changes, {}
        self.first = self.last = None
        self.at_once = False
        self.building = True
        return batch

    def finish(self) -> None:
        """The cycle ended; what changed meanwhile is due once quiet (often at once)."""
        self.building = False

    @property
    def state(self) -> str:
        if self.building:
            return "building"
        return "pending" if self.first is not None else "idle"

    @property
    def queued(self) -> bool:
        """A change arrived while building: one more cycle follows."""
        return self.building and self.first is not None
