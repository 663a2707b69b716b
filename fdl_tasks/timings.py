"""``--timings``: record a run's steps and write its page under ``target/cluster/_timings/``.

Thin I/O around :mod:`fdl_tasks.timeline` (the spans) and
:mod:`fdl_tasks.timings_html` (the HTML). A run without ``--timings`` has no
timeline, and every helper here is then a no-op. The page is written whether
the run succeeded or failed (a failed run is the one worth looking at); only
the last :data:`KEEP` pages of a command are kept.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from fdl_tasks.atomic_files import write_atomically
from fdl_tasks.layout import CARGO_TIMINGS_DIR, TIMINGS_DIR, timings_page
from fdl_tasks.reporting import Report
from fdl_tasks.run import Run
from fdl_tasks.timeline import Timeline, fold_rounds
from fdl_tasks.timings_html import render

if TYPE_CHECKING:  # the Fleet's import (Fabric, paramiko) is the caller's to pay
    from fdl_tasks.builder import JobResult
    from fdl_tasks.remote import Fleet

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
    stamp = started.strftime("%Y%m%dT%H%M%S.%fZ")
    path = run.root / timings_page(command, stamp)
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
def round_trips(run: Run, fleet: Fleet, kind: str) -> Iterator[None]:
    """Each host's round trips made inside the block, as one span per host."""
    mark = len(fleet.rounds)
    try:
        yield
    finally:
        if run.timeline is not None:
            for host, (start, end, ok) in fold_rounds(fleet.rounds[mark:]).items():
                run.timeline.add(kind, host, start, end, ok=ok)


def record_builds(run: Run, results: Sequence[JobResult], *, mode: str) -> None:
    """Each build environment's build, linked to cargo's own report of it."""
    timeline = run.timeline
    if timeline is None:
        return
    timeline.mode = mode
    pages = run.root / TIMINGS_DIR
    for result in results:
        job = result.job
        report = cargo_report(run.root / job.target_dir, since=_wall(result.started))
        link = os.path.relpath(report, pages) if report else None
        end = result.started + result.seconds
        timeline.add(
            "build", job.name, result.started, end, ok=result.ok, hosts=job.hosts, link=link
        )


def _wall(monotonic: float) -> float:
    """A monotonic instant as wall-clock seconds (file times are wall-clock)."""
    return time.time() - (time.monotonic() - monotonic)


def cargo_report(target_dir: Path, *, since: float) -> Path | None:
    """The report cargo ``--timings`` wrote in this target dir for this build, if any.

    cargo writes ``cargo-timing-<stamp>.html`` (and overwrites
    ``cargo-timing.html``) per build; the newest stamped one written since the
    build started is this build's, so a kept page keeps linking to its own.
    """
    reports = sorted((target_dir / CARGO_TIMINGS_DIR).glob("cargo-timing-*.html"))
    for report in reversed(reports):
        try:
            if report.stat().st_mtime >= since - 1:
                return report
        except OSError:
            continue
        break
    return None
