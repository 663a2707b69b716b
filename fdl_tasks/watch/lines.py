"""What the watcher and a waiting launch say: one status line per cycle, and why.

Pure: values in, text out, so every line is tested as the user reads it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fdl_tasks.build.build_environment import Build
from fdl_tasks.publish.verification_io import Verification
from fdl_tasks.tree.scope import ChangeKind, under


def shown(path: str, root: str) -> str:
    """A path as the user knows it: relative to the root when inside it."""
    return posixpath.relpath(path, root) if under(path, root) and path != root else path


def describe_changes(changes: Mapping[str, ChangeKind], root: str, limit: int = 3) -> str:
    """``ddp-bench/src/main.rs changed`` or ``4 files changed (a, b, c, …)``."""
    names = sorted(shown(p, root) for p in changes)
    if not names:
        return "nothing changed"
    if len(names) == 1:
        return f"{names[0]} changed"
    more = ", …" if len(names) > limit else ""
    return f"{len(names)} files changed ({', '.join(names[:limit])}{more})"


def cycle_line(
    number: int,
    seconds: float,
    what: str,
    rebuilt: Sequence[str],
    fresh: int,
    verified: str,
    probed: bool = False,
) -> str:
    """The one status line of a good cycle: ``rebuilt`` labels, ``fresh`` builds cargo
    found up to date, ``probed`` when preflight ran again."""
    if rebuilt:
        built = f"rebuilt {', '.join(rebuilt)}" + (f" ({fresh} up to date)" if fresh else "")
    else:
        built = f"{fresh} build(s) up to date"
    probe = "preflight ok; " if probed else ""
    return (
        f"watch: cycle {number} ok in {seconds:.1f}s ({what}): {probe}{built}; {verified}; "
        "published"
    )


def build_labels(specs: Iterable[Build]) -> list[str]:
    """Builds as a reader knows them: by libtorch variant (and CPU of a cross build)."""
    labels = [f"{s.arch} ({s.cpu_arch})" if s.cpu_arch else s.arch for s in specs]
    return [
        f"{label} x{labels.count(label)}" if labels.count(label) > 1 else label
        for label in dict.fromkeys(labels)
    ]


def verified_text(verification: Verification | None) -> str:
    """A cycle's verification in a few words (``None``: verification was off)."""
    if verification is None:
        return "verification off (--no-verify)"
    return verification.summary(meaning="")


def failed_line(number: int, seconds: float, what: str) -> str:
    return (
        f"watch: cycle {number} FAILED after {seconds:.1f}s ({what}); no envelope is published "
        "until a cycle succeeds; watching for the next change"
    )


def stopped_line(command: str, cycle: int, building: bool, published: bool, last_ok: bool) -> str:
    """What a stop leaves: the envelope the last good cycle published, or none."""
    during = f" during cycle {cycle}" if building and cycle else ""
    if published:
        left = f"the envelope of {command} stays published"
        if last_ok and not during:
            left += f" (cycle {cycle}'s)"
    else:
        left = f"no envelope of {command} is published"
    return f"watch stopped{during}; {left}"


def busy_reason(state: Mapping[str, Any]) -> str | None:
    """Why launch must wait for the watcher, from its state alone."""
    cycle, phase = state.get("cycle"), state.get("state")
    if phase == "building":
        more = ", and a change waits for the next one" if state.get("queued") else ""
        return f"cycle {cycle} is building{more}"
    if phase == "pending":
        return "a change is waiting for its cycle"
    return None
