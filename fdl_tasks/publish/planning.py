"""A prebuild's plan: preflight's verdicts reported, the builds planned from them, and
the builds' looks taken beside the probe.

A look (:meth:`~fdl_tasks.build.build_record_io.Records.look_ahead`) only reads:
the record, the project's files, the verdict. Taken while the ssh probe waits on
its hosts, it is off the builds' path; a build whose plan or record changed by
the time it runs looks again. A build that will run has its ``docker exec``
started then, waiting for its command (:mod:`fdl_tasks.core.standbys`). Nothing
is built, written or removed before preflight has passed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial

import attrs

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.build.build_record_io import Records
from fdl_tasks.build.readiness import NOTHING_BUILT
from fdl_tasks.build.readiness_io import require_ready, variant_problem
from fdl_tasks.config.model import Worker
from fdl_tasks.config.run import Run
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.auto_arch import AUTO
from fdl_tasks.preflight.gpu_gate import with_chosen_archs
from fdl_tasks.preflight.login_verdicts import preflight_error
from fdl_tasks.preflight.preflight import cross_cpu_archs, run_preflight
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.preflight.probe_report import note_lines, report_lines
from fdl_tasks.publish.verification_io import require_one_reached
from fdl_tasks.ssh.remote import Fleet


def report_preflight(
    run: Run, verdicts: Sequence[HostVerdict], as_json: bool, *, building: bool = False
) -> None:
    """Problems, the notes not said already (:meth:`Run.notes_to_say`) and a summary; an
    error on any host stops everything (before any build, said when ``building``)."""
    notes = run.notes_to_say("preflight", note_lines(verdicts))
    for line, severity in report_lines(verdicts, notes):
        run.report(line, severity)
    if as_json:
        print(json.dumps([v.to_json() for v in verdicts], indent=2))
    if failed := [v for v in verdicts if v.status == "error"]:
        then = f"; {NOTHING_BUILT}" if building else ""
        raise preflight_error(failed)(
            f"preflight found errors on {', '.join(v.host for v in failed)}{then}"
        )


def plan(
    run: Run,
    backend: Backend,
    workers: Sequence[Worker],
    command: str,
    crate: str,
    cpu_archs: Mapping[str, str],
) -> list[BuildJob]:
    """The builds, and every variant they link checked on the controller before any runs."""
    if auto := [w.host for w in workers if w.arch == AUTO]:
        raise FdlError(
            f"arch: auto on {', '.join(auto)} is chosen from preflight's probe, which "
            "inv --dry does not make: run inv prebuild, or set 'arch'"
        )
    shared = run.settings.shared_builds
    jobs = plan_builds(workers, backend, command, crate, shared, cpu_archs=cpu_archs)
    missing = variant_problem(run.root, {h: j.build.environment for j in jobs for h in j.hosts})
    if missing:
        raise FdlError(f"{missing}\n{NOTHING_BUILT}")
    return jobs


def probe_and_plan(
    run: Run,
    fleet: Fleet,
    backend: Backend,
    command: str,
    crate: str,
    records: Records | None = None,
) -> tuple[Run, list[BuildJob], list[HostVerdict]]:
    """Preflight of the run's remote hosts, then the builds planned from what it found:
    the CPU architectures it read, each ``arch: auto`` host's choice (the run returned
    carries it, exactly as if written in the cluster file), checked on the controller
    then, since preflight could not know it. With ``records``, the builds' looks are
    taken beside the probe (:func:`look_ahead`)."""
    ahead = partial(look_ahead, run, backend, command, crate, records) if records else None
    verdicts = run_preflight(run, fleet, backend, abi=True, crate=crate, beside=ahead)
    report_preflight(run, verdicts, as_json=False, building=True)
    require_one_reached(run, verdicts)
    auto = any(w.arch == AUTO for w in run.remotes)
    if auto:
        run = attrs.evolve(run, cluster=with_chosen_archs(run.cluster, verdicts))
    jobs = plan(run, backend, run.remotes, command, crate, cross_cpu_archs(run, verdicts))
    if auto:
        require_ready(run.root, backend, jobs)
    return run, jobs, verdicts


def look_ahead(run: Run, backend: Backend, command: str, crate: str, records: Records) -> None:
    """Each build's look, as planned before the probe (the pinned CPU architectures; none
    with an ``arch: auto`` host, whose plan is the probe's), and what a build that will
    run runs in started ahead (:meth:`Backend.stand_by`). Best effort: a plan or a look
    that fails here is made, and said, again after preflight."""
    if any(w.arch == AUTO for w in run.remotes):
        return
    try:
        for job in plan(run, backend, run.remotes, command, crate, cross_cpu_archs(run)):
            if records.look_ahead(job):
                backend.stand_by(job)
    except (FdlError, OSError):
        return
