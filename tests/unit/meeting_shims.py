"""Shims that prove two programs of a host script run side by side, without a clock.

Each shim marks that it started, then waits (at most 3 s, less than the probe's
``timeout 5`` around a GPU tool) for its partner's mark, and writes ``alone`` into
its own mark if that never came. Run one after the other, the first is alone.
"""

from __future__ import annotations

from pathlib import Path

_MEETING = """#!/bin/sh
: > "$MEET/{me}"
n=0; while [ ! -e "$MEET/{other}" ] && [ $n -lt 30 ]; do sleep 0.1; n=$((n + 1)); done
[ -e "$MEET/{other}" ] || echo alone > "$MEET/{me}"
{then}
"""


def meeting_shims(shims: Path, meet: Path, pair: dict[str, tuple[str, str]]) -> None:
    """``pair``: each shim's name → (its partner's name, the shell line it ends with)."""
    for name, (other, then) in pair.items():
        (shims / name).write_text(_MEETING.format(me=name, other=other, then=then))
        (shims / name).chmod(0o755)


def met(meet: Path, *names: str) -> bool:
    """Whether every one of ``names`` ran and found its partner running."""
    return all((meet / name).read_text() == "" for name in names)
