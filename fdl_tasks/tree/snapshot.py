"""What a look at the tree saw, and what changed between two looks.

Pure: stats and content digests are handed in. A file changed when its kind,
size, nanosecond mtime, ctime, inode or device differ. That is not enough
where a second save lands in the same clock tick as the first: on a mount
that keeps seconds (or a kernel whose clock ticks in milliseconds) both saves
can carry the same times and, for an edit that keeps the size, the same stat.
As git does with "racily clean" index entries, a stat taken less than
:data:`RACY_NS` after the file's last change is not trusted: the file's
content digest is kept with it, and the next look compares content too. A
look made later than that settles the doubt for good (any later write falls
in a later tick), so only files changed in the last seconds are ever read.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from typing import Any

import attrs

from fdl_tasks.tree.scope import under


class Change(enum.IntEnum):
    """What happened to a path: the values of inotify's events as ``watchfiles`` reports
    them, so the watcher's and a look's changes are one kind (without importing
    ``watchfiles`` where no watch runs)."""

    added = 1
    modified = 2
    deleted = 3


#: A stat taken less than this after the file's change is not trusted alone: it
#: covers a 1 s mount clock, FAT's 2 s, and a tick of the kernel's coarse clock.
RACY_NS = 2_500_000_000


@attrs.frozen
class Entry:
    """One path as a look saw it; ``digest``: its content's, when the stat was racy."""

    is_dir: bool
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    mode: int
    digest: str | None = None

    @property
    def changed_ns(self) -> int:
        """The last change the file system recorded (ctime moves on every write too,
        and nobody can set it back)."""
        return max(self.mtime_ns, self.ctime_ns)

    def same_stat(self, other: Entry) -> bool:
        return self.stat() == other.stat()

    def stat(self) -> tuple[bool, int, int, int, int, int, int]:
        """Every field but the digest, in the order the constructor and JSON take them."""
        return (self.is_dir, self.size, self.mtime_ns, self.ctime_ns, self.ino, self.dev, self.mode)

    def with_digest(self, digest: str | None) -> Entry:
        """This stat with ``digest`` (a look sets one per counted file: kept cheap)."""
        return Entry(*self.stat(), digest)

    def to_json(self) -> list[Any]:
        return [*self.stat(), self.digest]

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        """:class:`ValueError` when ``data`` is not what :meth:`to_json` wrote."""
        if not isinstance(data, list) or len(data) != 8:
            raise ValueError("entry")
        is_dir, *numbers, digest = data
        if not isinstance(is_dir, bool) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in numbers
        ):
            raise ValueError("entry")
        if digest is not None and not isinstance(digest, str):
            raise ValueError("entry")
        size, mtime_ns, ctime_ns, ino, dev, mode = numbers
        return cls(is_dir, size, mtime_ns, ctime_ns, ino, dev, mode, digest)


@attrs.frozen
class Snapshot:
    """A look: every path seen, the directories listed, the trees walked, and when
    (the file system's clock, ns) the look started."""

    entries: Mapping[str, Entry]
    dirs: frozenset[str]
    trees: tuple[str, ...]
    taken_ns: int

    def covers(self, path: str) -> bool:
        """Whether this look would have seen ``path`` had it existed."""
        return posixpath.dirname(path) in self.dirs or any(
            under(path, t) and path != t for t in self.trees
        )

    def to_json(self, changed_from: Snapshot | None = None) -> dict[str, Any]:
        """``changed_from``: only the entries that differ from that look's."""
        before = changed_from.entries if changed_from else {}
        return {
            "taken_ns": self.taken_ns,
            "trees": list(self.trees),
            "dirs": sorted(self.dirs),
            "entries": {
                path: e.to_json()
                for path, e in sorted(self.entries.items())
                if before.get(path) != e
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Snapshot:
        """:class:`ValueError` when ``data`` is not what :meth:`to_json` wrote."""
        taken, trees, dirs, entries = data["taken_ns"], data["trees"], data["dirs"], data["entries"]
        if not isinstance(taken, int) or not (isinstance(trees, list) and isinstance(dirs, list)):
            raise ValueError("look")
        if not all(isinstance(p, str) for p in [*trees, *dirs]) or not isinstance(entries, dict):
            raise ValueError("look")
        found = {str(path): Entry.from_json(e) for path, e in entries.items()}
        return cls(found, frozenset(dirs), tuple(trees), taken)


def racy(entry: Entry, now_ns: int) -> bool:
    """A stat too close to the file's last change to prove a later save would move it."""
    return not entry.is_dir and now_ns - entry.changed_ns < RACY_NS


def needs_digest(old: Entry | None, new: Entry, now_ns: int) -> bool:
    """Whether a look must read the file: its stat is racy now, or the last look's was
    and the stat has not moved since (only the content can tell)."""
    if new.is_dir:
        return False
    if racy(new, now_ns):
        return True
    return old is not None and old.digest is not None and old.same_stat(new)


def modified(old: Entry, new: Entry) -> bool:
    if old.is_dir != new.is_dir:
        return True
    if new.is_dir:
        return False  # a directory's own times move with its entries: not a change
    if not old.same_stat(new):
        return True
    return old.digest is not None and new.digest is not None and old.digest != new.digest


def diff(old: Snapshot, new: Snapshot, since_ns: int | None = None) -> set[tuple[Change, str]]:
    """What changed from ``old`` to ``new``, as file watcher events.

    A path only one look could see (the watch plan changed between them) is no
    change, except a file ``new`` alone covers that changed at or after
    ``since_ns`` (the cycle's start): it may have changed unwatched.
    """
    changes: set[tuple[Change, str]] = set()
    for path, entry in new.entries.items():
        if (before := old.entries.get(path)) is not None:
            if modified(before, entry):
                changes.add((Change.modified, path))
        elif old.covers(path) or (since_ns is not None and entry.changed_ns >= since_ns):
            changes.add((Change.added, path))
    for path in old.entries.keys() - new.entries.keys():
        if new.covers(path):
            changes.add((Change.deleted, path))
    return changes


def settled(snapshot: Snapshot) -> Snapshot:
    """The look to compare the next one with: digests kept only where still racy."""
    entries = {
        path: e if e.digest is None or racy(e, snapshot.taken_ns) else e.with_digest(None)
        for path, e in snapshot.entries.items()
    }
    return attrs.evolve(snapshot, entries=entries)


def union(earlier: Snapshot | None, look: Snapshot) -> Snapshot:
    """Two looks together: a file that differs from either of them is a change (an entry
    of the earlier look stays where the two differ)."""
    if earlier is None:
        return look
    entries = {**look.entries, **earlier.entries}
    return Snapshot(entries, earlier.dirs | look.dirs, look.trees, look.taken_ns)


def changed_since(snapshot: Snapshot, since_ns: int) -> dict[str, Entry]:
    """Files changed at or after ``since_ns``: what launch must compare, as this look saw them."""
    return {p: e for p, e in snapshot.entries.items() if not e.is_dir and e.changed_ns >= since_ns}


def unseen(seen: Mapping[str, Entry], path: str, now: Entry, stamp_ns: int) -> bool | None:
    """Whether ``path`` (stat ``now``, no digest) may hold what the cycle did not see.

    ``True``: changed after the cycle's start and not as the cycle saw it;
    ``False``: as seen; ``None``: only its content can tell (compare it with
    ``seen[path].digest``). A change at the stamp's own tick counts as possibly
    after it: on a coarse clock a tie says nothing about the order.
    """
    if now.changed_ns < stamp_ns:
        return False
    before = seen.get(path)
    if before is None or not before.same_stat(now):
        return True
    return None if before.digest is not None else False
