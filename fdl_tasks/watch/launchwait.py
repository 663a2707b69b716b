"""``inv launch`` waits for a running ``prebuild --watch`` to publish what the sources say.

Thin: reads the watcher's state file and lock, and the mtimes of the files
its scope counts (a save the watcher has not seen yet, on a mount whose
events are slow or missing, must not launch the binary it replaces).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fdl_tasks.errors import FdlError
from fdl_tasks.reporting import Report
from fdl_tasks.watch.files import WatchFiles, read_state, watcher_alive
from fdl_tasks.watch.lines import busy_reason, shown
from fdl_tasks.watch.scope import Scope
from fdl_tasks.watch.workspace import newest_change

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
            report(f"launch: waiting for the prebuild watcher (pid {pid}): {reason}")
            said = reason
        time.sleep(_LAUNCH_POLL)


def _unseen_change(state: Mapping[str, Any]) -> str | None:
    """A watched file newer than the last cycle's start (shown relative to the root)."""
    snapshot = state.get("snapshot")
    try:
        scope = Scope.from_json(state.get("scope") or {})
    except ValueError:
        return None
    if not isinstance(snapshot, int | float):
        return None
    newest = newest_change(scope)
    if newest is None or newest[0] <= snapshot:
        return None
    return shown(newest[1], scope.root)
