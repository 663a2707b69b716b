"""The build record: what a target dir's last good build of a command read, by content.

Pure: looks at the tree, stats and digests are handed in. cargo calls a unit
fresh when no source's mtime is newer than its last build, which fails where
a changed file's mtime does not move forward: two saves in one second on a
mount that keeps whole seconds (SSHFS, S3-FUSE), a server clock behind the
controller's (NFS), ``rsync -t``, ``cp -p``, ``tar x``. The record closes that
hole on stable cargo. After each good build it keeps:

- the build's *identity*: the toolchain's content id and the whole build line
  with the run's own names left out (``None`` where the mode cannot name
  everything its build reads outside the project: then cargo always runs);
- a *look* taken when the build started (:mod:`fdl_tasks.tree.snapshot`): the
  nanosecond stat of every file of the project, the variant and the user's
  mounts, and the content digest of every file that counts (sources,
  manifests, and whatever a unit named);
- the *units*: each cargo fingerprint directory of the target dir, and the
  files its dep-info (or its build script's ``rerun-if-changed``) names;
- the binary's stat once cargo wrote it.

At the next build, :func:`verdict` compares: a unit that read a file whose
content changed is *forced* (its fingerprint directory is removed, so cargo
rebuilds that unit and what depends on it, and nothing else), and a build
whose identity, files and binary are all as recorded is *fresh* (no cargo).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from fdl_tasks.core.binary_files import BinaryFacts
from fdl_tasks.core.console import listed
from fdl_tasks.tree.scope import under
from fdl_tasks.tree.snapshot import Entry, Snapshot, diff, racy

#: Bumped when what a record holds changes: a record of another version is no record.
VERSION = 5

#: The run id in a record's build line: the same for every run.
RECORD_RUN_ID = "record"

#: The digest of a file the build may have read in another state than the one seen after
#: it (it changed while the build ran): never equal to a content's digest.
UNKNOWN = "unknown"


@attrs.frozen
class RecordInputs:
    """What a backend says a build reads besides the project and its variant.

    ``identity``: the toolchain's content id and the build line, equal for two runs
    only when cargo would be run the same way (``None``: the mode cannot tell, so
    cargo always runs; content still forces what changed); ``mounts``: container
    path → controller path of every mount (``None``: the variant), to find what a
    unit names on the controller (none: the paths are the controller's own);
    ``walked``: the user's mounts, each looked at whole; ``rustup``: mounted rustup
    homes (too big to walk), looked at by the files an install or update rewrites.
    """

    identity: str | None
    mounts: tuple[tuple[str, str | None], ...]
    walked: tuple[str, ...] = ()
    rustup: tuple[str, ...] = ()


def named(units: Mapping[str, Iterable[str]]) -> set[str]:
    """Every path some unit names."""
    return {path for paths in units.values() for path in paths}


def read_by_units(look: Snapshot, reads: set[str]) -> set[str]:
    """The paths of ``look`` some unit read: named, or in a named directory's tree."""
    trees = [
        path
        for path in reads
        if path in look.trees or ((entry := look.entries.get(path)) and entry.is_dir)
    ]
    return {p for p in look.entries if p in reads or any(under(p, t) for t in trees)}


@attrs.frozen
class BuildRecord:
    """What one good build read (``look``, ``units``) and the binary it left.

    ``attempt``: the look of a later build that started and did not end well (failed,
    stopped, killed): its units may hold what that build compiled, so a file that
    differs from either look is a change. It has a file of its own, which names the
    record's ``serial`` (:mod:`fdl_tasks.build.record_attempt`).
    """

    identity: str | None
    look: Snapshot
    units: Mapping[str, tuple[str, ...]]
    binary: Entry
    attempt: Snapshot | None = None
    serial: str = attrs.field(factory=lambda: secrets.token_hex(8), eq=False)
    #: The binary's digest and glibc need, read as the record was made (``None``: unread).
    built: BinaryFacts | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": VERSION,
                "identity": self.identity,
                "look": self.look.to_json(),
                "units": {unit: list(paths) for unit, paths in sorted(self.units.items())},
                "binary": self.binary.to_json(),
                "serial": self.serial,
                "built": self.built.to_json() if self.built else None,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BuildRecord | None:
        """The record ``text`` holds; ``None`` for anything else (another version, a torn
        write): the build then cannot trust what it reads, and forces (see ``verdict``)."""
        try:
            data: Any = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                return None
            identity, units, serial = data["identity"], data["units"], data["serial"]
            if not (identity is None or isinstance(identity, str)) or not isinstance(units, dict):
                return None
            if not isinstance(serial, str):
                return None
            if not all(
                isinstance(paths, list) and all(isinstance(p, str) for p in paths)
                for paths in units.values()
            ):
                return None
            return cls(
                identity,
                Snapshot.from_json(data["look"]),
                {u: tuple(p) for u, p in units.items()},
                Entry.from_json(data["binary"]),
                serial=serial,
                built=BinaryFacts.from_json(data["built"]) if data["built"] else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def reused_digest(old: Entry | None, new: Entry, previous_ns: int) -> str | None:
    """The digest a look may keep for a file that counts without reading it: the last
    look's, when the stat has not moved and was not racy then (``previous_ns``: when
    that look was taken); ``None``: read the file."""
    if old is None or old.digest in (None, UNKNOWN) or not old.same_stat(new):
        return None
    return None if racy(old, previous_ns) else old.digest


def content_changed(old: Entry | None, new: Entry | None) -> bool:
    """Whether a file a unit read differs now from what the build read: by content where
    both looks read it, else by stat (a file looked at by stat alone, or unreadable)."""
    if old is None or new is None:
        return old is not new  # added or removed
    if old.digest == UNKNOWN:
        return True  # changed while the build ran: what it read is not known
    if old.digest is not None and new.digest is not None:
        return old.digest != new.digest
    return not old.same_stat(new)


def units_reading(units: Mapping[str, Iterable[str]], paths: Iterable[str]) -> list[str]:
    """The units that read one of ``paths`` (a unit naming a directory reads its tree)."""
    wanted = list(paths)
    return sorted(
        unit
        for unit, named_paths in units.items()
        if any(under(path, n) for n in named_paths for path in wanted)
    )


@attrs.frozen
class Freshness:
    """``fresh``: cargo need not run; ``forced``: the units cargo must rebuild although
    their mtimes may say otherwise; ``changed``: the files changed by content."""

    fresh: bool
    forced: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


def verdict(
    record: BuildRecord, identity: str | None, now: Snapshot, binary: Entry | None
) -> Freshness:
    """What a build must do, from its record and a look taken now (with the record's as
    the previous one, so that a file whose stat moved or was racy has its digest).

    A file some unit named is compared by content: a touched file is no change, a
    rewritten one with its mtime set back is. Any other file of the tree added,
    removed or changed by stat keeps cargo running (it decides), as do another
    identity, a touched binary, or a look that covers what the record's did not; and
    so does a build that started since and did not end well (its ``attempt``).
    """
    then, attempt = record.look, record.attempt
    reads = named(record.units)
    paths = read_by_units(then, reads) | read_by_units(now, reads) | (reads - now.entries.keys())
    changed = sorted(
        p
        for p in paths
        if content_changed(then.entries.get(p), now.entries.get(p))
        or (attempt is not None and content_changed(attempt.entries.get(p), now.entries.get(p)))
    )
    others = {path for _, path in diff(then, now) if path not in paths}
    fresh = (
        not changed
        and attempt is None
        and not others
        and identity is not None
        and identity == record.identity
        and binary is not None
        and record.binary.same_stat(binary)
        and covered(now, then)
    )
    return Freshness(fresh, tuple(units_reading(record.units, changed)), tuple(changed))


def covered(now: Snapshot, then: Snapshot) -> bool:
    """Whether ``then`` looked at every tree and directory ``now`` does: what only the
    later look sees was never compared."""
    return set(now.trees) <= set(then.trees) and now.dirs <= then.dirs


def as_read(before: Snapshot, after: Snapshot) -> Snapshot:
    """The look a record keeps: each file as the build saw it when it started
    (``before``), and one first read after it (newly named by a unit, or new) from
    ``after`` only where its stat proves it unchanged since the start; else its digest
    is :data:`UNKNOWN`, so that the next build rebuilds what read it."""
    entries: dict[str, Entry] = {}
    for path, seen in after.entries.items():
        start = before.entries.get(path)
        if start is not None and (start.digest is not None or seen.digest is None):
            entries[path] = start
        elif seen.digest is None:
            entries[path] = start or seen  # looked at by stat alone
        elif (start is None or start.same_stat(seen)) and not racy(seen, before.taken_ns):
            entries[path] = seen
        else:
            entries[path] = seen.with_digest(UNKNOWN)
    for path, start in before.entries.items():
        entries.setdefault(path, start)  # removed while the build ran: a change next time
    trees = tuple(sorted({*before.trees, *after.trees}))
    return Snapshot(entries, before.dirs | after.dirs, trees, before.taken_ns)


def tree_digest(record: BuildRecord) -> str:
    """One digest of what the build's units read (each file's path and content digest,
    or its stat where it was looked at by stat alone): what the envelope's sidecar says
    each binary was built from."""
    look = record.look
    hasher = hashlib.blake2b(digest_size=16)
    for path in sorted(read_by_units(look, named(record.units))):
        entry = look.entries[path]
        if not entry.is_dir:
            hasher.update(f"{path}\0{entry.digest or entry.mtime_ns}\n".encode())
    return hasher.hexdigest()


def first_changed(record: BuildRecord, now: Snapshot) -> str | None:
    """The first file (by path) some unit of ``record`` read whose content differs in
    ``now``; ``None`` when the binary was built from what is on disk."""
    return next(iter(verdict(record, None, now, None).changed), None)


def forced_line(verdict: Freshness, root: Path) -> str:
    """What a build whose record forced units says before cargo starts."""
    units = f"{len(verdict.forced)} unit(s) rebuilt whatever their mtimes say"
    if not verdict.changed:
        return f"fdl: no usable record of what the last build read: {units}"
    changed = [os.path.relpath(path, root) for path in verdict.changed]
    return f"fdl: changed by content since the last good build: {listed(changed, 3)}; {units}"
