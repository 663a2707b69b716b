"""Is a target dir's binary still what cargo would build now? A stamp answers without cargo.

Pure: the looks at the tree and the binary's stat are handed in. A no-op
prebuild used to start one container per build environment only for cargo to
find nothing to do (three of them cost 0.65 s of a 1.1 s no-op on 2 cores).
A stamp, written after a build succeeds, records what that build read:

- its *identity*: the whole build line with the run's own names taken out,
  and the toolchain's content id (the image's, for ``docker run``). A mode
  that cannot name everything its build reads outside the project gives
  none, and always runs cargo;
- a look taken *before* cargo started (:mod:`fdl_tasks.watch.snapshot`:
  nanosecond stat of every file, content digests where a stat is too recent
  to be trusted) at the project, the variant's libtorch, the user's mounts,
  and whatever the previous build's dep-info and build scripts named;
- the binary's stat once cargo wrote it.

The binary is up to date when all three are what they are now: the same
identity, a look that covers no directory the stamp's did not, no file added,
removed or changed since, and the binary untouched. Any file of the project
counts, not only those cargo tracks; a wrong "changed" only costs a container.
What a build reveals as it runs (its first dep-info, a new build script's
declarations) is covered from the next build on: until a look has seen it, the
coverage rule keeps the stamp from being fresh.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from fdl_tasks.watch.snapshot import Entry, Snapshot, diff, settled

#: Bumped when what a stamp records changes: an older stamp is then never fresh.
VERSION = 2


@attrs.frozen
class StampInputs:
    """What a backend says a build reads besides the project and its variant.

    ``identity``: the toolchain's content id and the build line, equal for two runs
    only when cargo would be run the same way; ``mounts``: container path → controller
    path of every mount (``None``: the variant), to find declared paths and dep-info
    entries on the controller; ``walked``: the user's mounts, each looked at whole;
    ``rustup``: mounted rustup homes (too big to walk), looked at by the files an
    install or update rewrites.
    """

    identity: str
    mounts: tuple[tuple[str, str | None], ...]
    walked: tuple[str, ...] = ()
    rustup: tuple[str, ...] = ()


def dep_info_paths(text: str) -> list[str]:
    """The files a cargo dep-info file (``release/<bin>.d``) says the binary depends on:
    its sources, its path dependencies' and the build scripts' ``rerun-if-changed``
    (a space inside a path is written ``\\ ``)."""
    paths: list[str] = []
    for line in text.splitlines():
        target, colon, deps = line.partition(": ")
        if colon and target:
            words = re.split(r"(?<!\\) ", deps)
            paths += [w.replace("\\ ", " ") for w in words if w]
    return paths


@attrs.frozen
class BuildStamp:
    """What one successful build read, and the binary it wrote."""

    identity: str
    inputs: Snapshot
    binary: Entry

    def to_json(self) -> str:
        inputs = self.inputs
        return json.dumps(
            {
                "version": VERSION,
                "identity": self.identity,
                "taken_ns": inputs.taken_ns,
                "trees": list(inputs.trees),
                "dirs": sorted(inputs.dirs),
                "entries": {path: e.to_json() for path, e in sorted(inputs.entries.items())},
                "binary": self.binary.to_json(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BuildStamp | None:
        """The stamp ``text`` holds; ``None`` for anything else (an old version, a torn
        write): a stamp that cannot be read only costs a build."""
        try:
            data: Any = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                return None
            identity, taken = data["identity"], data["taken_ns"]
            trees, dirs, entries = data["trees"], data["dirs"], data["entries"]
            if not (isinstance(identity, str) and isinstance(taken, int)):
                return None
            if not (isinstance(trees, list) and isinstance(dirs, list)):
                return None
            if not all(isinstance(p, str) for p in [*trees, *dirs]) or not isinstance(
                entries, dict
            ):
                return None
            inputs = Snapshot(
                {str(path): Entry.from_json(e) for path, e in entries.items()},
                frozenset(dirs),
                tuple(trees),
                taken,
            )
            return cls(identity, inputs, Entry.from_json(data["binary"]))
        except (ValueError, KeyError, TypeError):
            return None


def stamp_after_build(identity: str, before: Snapshot, binary: Entry) -> BuildStamp:
    """The stamp of a build that succeeded: ``before`` is the look taken before cargo
    ran (a file saved while it ran then counts as changed next time)."""
    return BuildStamp(identity, settled(before), binary)


def up_to_date(
    stamp: BuildStamp | None, identity: str | None, now: Snapshot, binary: Entry | None
) -> bool:
    """Whether cargo would find nothing to do: same identity, nothing changed since the
    stamp's look (``now``: a look taken with the stamp's as the previous one, so that a
    racy file is compared by content), and the binary as the build left it."""
    if stamp is None or identity is None or binary is None or stamp.identity != identity:
        return False
    if not stamp.binary.same_stat(binary) or not covered(now, stamp.inputs):
        return False
    return not diff(stamp.inputs, now)


def covered(now: Snapshot, then: Snapshot) -> bool:
    """Whether ``then`` looked at every tree and directory ``now`` does: what only the
    later look sees (the dep-info of the stamp's own build, say) was never compared."""
    return set(now.trees) <= set(then.trees) and now.dirs <= then.dirs
