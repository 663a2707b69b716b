"""A look at the watched tree: the stat of every path a watch plan covers, and the
content of the files whose stat cannot be trusted yet (:mod:`.snapshot`).

Thin I/O. The walk skips what the plan skips (``target/`` at the root or beside
a ``Cargo.toml``, ``<root>/libtorch`` but the variants' own trees, version
control and tool caches, the scope's excluded directories): a look costs a
stat per watched file, and a read only of files that count and changed in the
last few seconds.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Callable

from fdl_tasks.tree.roots import WatchPlan
from fdl_tasks.tree.scope import Scope, ignored_dir, under
from fdl_tasks.tree.snapshot import Entry, Snapshot, needs_digest, racy

_CHUNK = 1 << 20

#: The digest a look may keep without reading a file: (previous entry, entry now, when
#: the previous look was taken) → the previous digest, or ``None`` to read it.
KeepDigest = Callable[[Entry | None, Entry, int], str | None]


def digest(path: str) -> str | None:
    """The content's digest (``None``: unreadable now, which a later look retries)."""
    hasher = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK):
                hasher.update(chunk)
    except OSError:
        return None
    return hasher.hexdigest()


def entry_of(st: os.stat_result) -> Entry:
    return Entry(
        stat.S_ISDIR(st.st_mode),
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_dev,
        st.st_mode,
    )


#: A directory's entries: each one's name, path and stat (links followed).
Held = list[tuple[str, str, os.stat_result]]


def listed(directory: str) -> Held | None:
    """What ``directory`` holds now (``None``: it cannot be listed, gone meanwhile)."""
    try:
        with os.scandir(directory) as found:
            names = [e.name for e in found]
    except OSError:
        return None
    held = []
    for name in names:
        path = posixpath.join(directory, name)
        try:
            held.append((name, path, os.stat(path)))
        except OSError:
            continue  # a dangling link, or removed meanwhile
    return held


class Listings:
    """The directories the looks of one moment listed, each listed once: a run's builds
    look at one project tree beside preflight, and a look that reuses what another
    listed is one taken with it, so it takes the earliest of their clocks (an earlier
    clock makes more files too recent to trust, never fewer). Not thread-safe: the
    looks take turns."""

    def __init__(self) -> None:
        self.taken_ns: int | None = None
        self._held: dict[str, Held | None] = {}

    def clock(self, now_ns: int) -> int:
        """The clock for a look taken now that may reuse these listings."""
        self.taken_ns = now_ns if self.taken_ns is None else min(self.taken_ns, now_ns)
        return self.taken_ns

    def held(self, directory: str) -> Held | None:
        if directory not in self._held:
            self._held[directory] = listed(directory)
        return self._held[directory]


class _Look:
    """One look in progress: what it saw so far."""

    def __init__(
        self,
        scope: Scope,
        previous: Snapshot | None,
        now_ns: int,
        counts: Callable[[str], bool],
        keep: KeepDigest | None,
        racy_counts: Callable[[str], bool] | None,
        listings: Listings,
    ) -> None:
        self.scope, self.previous, self.now_ns, self.counts = scope, previous, now_ns, counts
        self.keep, self.racy_counts, self.listings = keep, racy_counts, listings
        self.libtorch = posixpath.join(scope.root, "libtorch")
        self.entries: dict[str, Entry] = {}
        self.dirs: set[str] = set()

    def add(self, path: str, st: os.stat_result) -> None:
        new = entry_of(st)
        old = self.previous.entries.get(path) if self.previous else None
        if self.keep is not None:
            counted = self.counts(path) or (
                self.racy_counts is not None and racy(new, self.now_ns) and self.racy_counts(path)
            )
            if not new.is_dir and counted:
                kept = self.keep(old, new, self.previous.taken_ns) if self.previous else None
                new = new.with_digest(kept or digest(path))
        elif needs_digest(old, new, self.now_ns) and self.counts(path):
            new = new.with_digest(digest(path))
        self.entries[path] = new

    def pruned(self, path: str, name: str, beside_manifest: bool) -> bool:
        return (
            ignored_dir(name)
            or (name == "target" and beside_manifest)
            or path == self.libtorch
            or any(under(path, d) for d in self.scope.excluded)
        )

    def listing(self, directory: str, recursive: bool) -> None:
        """``directory``'s entries (and, ``recursive``, its tree's), links followed once;
        a directory this look listed already is not listed again (a named one inside a
        walked tree: what it holds was seen, and what is below it was walked or pruned)."""
        stack, visited = [directory], set()
        while stack:
            current = stack.pop()
            if current in self.dirs:
                continue
            held = self.listings.held(current)
            if held is None:
                continue  # gone meanwhile: its entries are missing, so deleted
            self.dirs.add(current)
            beside_manifest = current == self.scope.root or any(n == "Cargo.toml" for n, *_ in held)
            for name, path, st in held:
                self.add(path, st)
                key = (st.st_dev, st.st_ino)
                if (
                    recursive
                    and stat.S_ISDIR(st.st_mode)
                    and key not in visited
                    and not self.pruned(path, name, beside_manifest)
                ):
                    visited.add(key)
                    stack.append(path)


def scan(
    plan: WatchPlan,
    scope: Scope,
    previous: Snapshot | None,
    now_ns: int,
    counts: Callable[[str], bool] | None = None,
    keep: KeepDigest | None = None,
    racy_counts: Callable[[str], bool] | None = None,
    listings: Listings | None = None,
) -> Snapshot:
    """Every path ``plan`` covers, as it is now; ``now_ns``: the file system's clock.

    ``previous`` (the last look) says which files must be read again to settle
    a racy stat; only files that count are ever read (``counts``; by default
    those ``scope`` classifies as a change). With ``keep`` (a build record's look),
    every file that counts has a digest: the previous look's where ``keep`` gives it
    back, else read now; ``racy_counts``: files that count too while their stat is
    racy (what a build reads that no one named yet: its content when the build starts);
    ``listings``: shared with the other looks of this moment (:class:`Listings`).
    """
    counted = counts or (lambda path: scope.classify(path) is not None)
    look = _Look(scope, previous, now_ns, counted, keep, racy_counts, listings or Listings())
    for tree in plan.recursive:
        look.listing(tree, recursive=True)
    for directory in plan.flat:
        look.listing(directory, recursive=False)
    return Snapshot(look.entries, frozenset(look.dirs), plan.recursive, now_ns)
