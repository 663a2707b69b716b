"""``--timings``: record a run's steps and write its page under ``target/cluster/_timings/``.

Thin I/O around :mod:`fdl_tasks.core.timeline` (the spans) and
:mod:`fdl_tasks.timings.timings_html` (the HTML). A run without ``--timings`` has no
timeline, and every helper here is then a no-op. The page is written whether
the run succeeded or failed (a failed run is the one worth looking at); only
the last :data:`KEEP` pages of a command are kept.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from fdl_tasks.config.layout import TIMINGS_DIR, timings_page
from fdl_tasks.config.run import Run
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.reporting import Report
from fdl_tasks.core.timeline import Timeline, fold_rounds

if TYPE_CHECKING:  # the Fleet's import (Fabric, paramiko) is the caller's to pay
    from fdl_tasks.ssh.remote import Fleet

#: Pages kept per command (a watcher writes one per cycle).
KEEP = 5


@contextmanager
def recorded(run: Run, command: str, report: Report | None = None) -> Iterator[Run]:
    """The run with a fresh timeline when ``fdl.timings`` is on; the page written at the end.

    ``report`` says where the page is (default: the run's own reporter).
    """
    if not run.settings.timings or run.dry:
        yield run
        return
    timeline = Timeline()
    started = datetime.datetime.now(datetime.UTC)
    ok = False
    try:
        yield attrs.evolve(run, timeline=timeline)
        ok = True
    finally:
        timeline.finish()
        path = write_page(run, command, timeline, started, ok)
        (report or run.report)(f"{run.task}: timings of this run: {path}")


def write_page(
    run: Run, command: str, timeline: Timeline, started: datetime.datetime, ok: bool
) -> Path:
    """The page, atomically, then the command's older pages beyond :data:`KEEP` removed."""
    from fdl_tasks.timings.timings_html import render  # here: only --timings writes a page

    path = run.root / timings_page(command, started.strftime("%Y%m%dT%H%M%S.%fZ"))
    data = timeline.data(
        task=run.task, command=command, ok=ok, started=started.isoformat(timespec="seconds")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, render(data))
    pages = sorted((run.root / TIMINGS_DIR).glob(f"{command}-*.html"))
    for old in pages[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


@contextmanager
def step(run: Run, kind: str, name: str) -> Iterator[None]:
    """Time one step of the run (publication) when the run records a timeline."""
    if run.timeline is None:
        yield
        return
    with run.timeline.span(kind, name):
        yield


@contextmanager
def round_trips(run: Run, fleet: Fleet, kind: str, since: int | None = None) -> Iterator[None]:
    """Each host's round trips made inside the block (and from the fleet's round
    ``since``, when given), as one span per host."""
    mark = len(fleet.rounds) if since is None else since
    try:
        yield
    finally:
        if run.timeline is not None:
            for host, (start, end, ok) in fold_rounds(fleet.rounds[mark:]).items():
                run.timeline.add(kind, host, start, end, ok=ok)
