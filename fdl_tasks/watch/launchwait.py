"""``inv launch`` waits for a running ``prebuild --watch`` to publish what the sources say.

Thin: reads the watcher's state file and lock, and the stats of the files
its scope counts (a save the watcher has not seen yet, on a mount whose
events are slow or missing, must not launch the binary it replaces). A file
changed (mtime or ctime, to the nanosecond) before the last cycle's stamp was
seen by it; one changed at or after the stamp was seen only if it is still
as the cycle's first look recorded it (content compared where that look's
stat was racy): on a mount that keeps seconds, a tie with the stamp says
nothing about which came first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, Severity
from fdl_tasks.tree.scan import digest, entry_of
from fdl_tasks.tree.scope import Scope
from fdl_tasks.tree.snapshot import Entry, unseen
from fdl_tasks.tree.workspace import scope_files
from fdl_tasks.watch.lines import busy_reason, shown
from fdl_tasks.watch.state_files import WatchFiles, read_state, watcher_alive

#: How long a change newer than the last cycle may stay unseen by the watcher (s).
UNSEEN_GRACE = 10.0
_LAUNCH_POLL = 0.2


def wait_for_watch(root: Path, command: str, timeout: float, report: Report) -> None:
    """Before a launch: let a running ``prebuild --watch`` publish what the sources say.

    Returns at once without a watcher (or with a dead one's state). Waits while
    a cycle is pending or building, or while a watched file is newer than the
    last cycle's start; raises :class:`FdlError` when the last cycle failed or
    when ``timeout`` seconds pass.
    """
    files = WatchFiles(root, command)
    started = time.monotonic()
    said: str | None = None
    unseen_since: float | None = None
    while True:
        state = read_state(files.state)
        if state is None:
            return
        pid = state.get("pid", "?")
        if not watcher_alive(files, state):
            report(f"launch: ignoring the state of a prebuild watcher that has ended (pid {pid})")
            return
        reason = busy_reason(state)
        now = time.monotonic()
        if reason is None:
            unseen = _unseen_change(state)
            if unseen is None:
                if state.get("state") == "failed":
                    raise FdlError(
                        f"the prebuild watcher (pid {pid}) failed its last cycle "
                        f"({state.get('cycle')}), so {command} has no envelope: fix what it "
                        "reported and save"
                    )
                if said is not None:
                    report(f"launch: the watcher published cycle {state.get('cycle')}")
                return
            unseen_since = now if unseen_since is None else unseen_since
            reason = f"{unseen} changed after cycle {state.get('cycle')} started"
            if now - unseen_since > UNSEEN_GRACE:
                raise FdlError(
                    f"{reason}, but the prebuild watcher (pid {pid}) has not picked it up in "
                    f"{UNSEEN_GRACE:g}s: does it see this file system? (fdl.watch_polling)"
                )
        else:
            unseen_since = None
        if now - started > timeout:
            raise FdlError(
                f"the prebuild watcher (pid {pid}) has not published in {timeout:g}s "
                f"({reason}); not launching a binary older than the sources "
                "(fdl.launch_wait sets the bound)"
            )
        if reason != said:
            report(f"launch: waiting for the prebuild watcher (pid {pid}): {reason}", Severity.WAIT)
            said = reason
        time.sleep(_LAUNCH_POLL)


def _unseen_change(state: Mapping[str, Any]) -> str | None:
    """A watched file the last cycle may not have seen (shown relative to the root)."""
    stamp_ns = state.get("stamp_ns")
    try:
        scope = Scope.from_json(state.get("scope") or {})
        seen = {str(p): Entry.from_json(e) for p, e in dict(state.get("seen") or {}).items()}
    except (ValueError, TypeError):
        return None
    if not isinstance(stamp_ns, int) or isinstance(stamp_ns, bool):
        return None
    for path in scope_files(scope):
        if scope.classify(path) is None:
            continue
        try:
            now = entry_of(os.stat(path))
        except OSError:
            continue
        verdict = unseen(seen, path, now, stamp_ns)
        if verdict is None:  # a racy stat at the cycle's start: the content tells
            verdict = digest(path) != seen[path].digest
        if verdict:
            return shown(path, scope.root)
    return None
