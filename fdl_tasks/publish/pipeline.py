"""The prebuild pipeline: preflight, builds, verification, publication.

Tasks call these with a :class:`~fdl_tasks.config.run.Run`; each step reports
progress through ``run.report`` and raises :class:`FdlError` with every
problem of its step together (:class:`~fdl_tasks.core.errors.Stopped` when the
user stops it). Results are returned; the task writes the process
environment.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

import fdl_tasks.publish.envelope as envelope
from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record_io import Records
from fdl_tasks.build.build_results import JobResult, settled
from fdl_tasks.build.build_step import build_records, run_backend, run_builds
from fdl_tasks.build.parked_standbys import Parking
from fdl_tasks.build.readiness import crate_missing, root_missing
from fdl_tasks.build.readiness_io import require_ready
from fdl_tasks.config.layout import LOCK_FILE
from fdl_tasks.config.model import Worker
from fdl_tasks.config.names import check_crate_dir
from fdl_tasks.config.run import Run
from fdl_tasks.core.atomic_files import remove_partials
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.locks import project_lock
from fdl_tasks.core.reporting import Severity
from fdl_tasks.core.standbys import Standbys
from fdl_tasks.gpu.auto_arch import AUTO
from fdl_tasks.preflight.preflight import cross_cpu_archs, dry_run_lines, run_preflight
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.publish.delivery import copy_hosts
from fdl_tasks.publish.delivery_io import copy_step
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.freshness import write_sources
from fdl_tasks.publish.planning import plan, probe_and_plan, report_preflight
from fdl_tasks.publish.verification_io import (
    FirstAsks,
    Verification,
    require_verification_possible,
    verify_hosts,
)
from fdl_tasks.ssh.remote import Fleet
from fdl_tasks.timings.recording import step


@attrs.frozen(kw_only=True)
class Publication:
    """What a successful prebuild published, and what it verified."""

    command: str
    entries: Mapping[str, PerHostEnvelope]
    text: str
    path: Path
    results: tuple[JobResult, ...]
    verification: Verification | None
    #: The preflight verdicts the builds were planned from (this run's, or those handed in).
    verdicts: tuple[HostVerdict, ...] = ()


def preflight(run: Run, *, abi: bool, as_json: bool = False) -> list[HostVerdict]:
    """The readiness probe alone (``inv preflight``, ``prebuild --no-prebuild``): every
    host's verdict (none under --dry)."""
    run.note_unlisted_controller()
    if run.dry:
        for line in dry_run_lines(run, abi=abi):
            run.report(line)
        return []
    backend = backend_for(run.cluster, secrets.token_hex(4), None)  # checks only: no cache
    with Fleet(run.remotes, run.settings, run.report, once=True) as fleet:
        verdicts = run_preflight(run, fleet, backend, abi=abi)
    report_preflight(run, verdicts, as_json)
    return verdicts


def resolve_crate_dir(run: Run, option: str | None, command: str) -> str:
    """Option, else setting, else ``<root>/<command>`` when it is a crate, else the root."""
    chosen = option if option is not None else run.settings.crate_dir
    source = run.cluster.source
    if not run.root.is_dir():
        raise FdlError(root_missing(str(run.root), source))
    if chosen:
        relative = check_crate_dir(chosen)
    else:
        relative = command if (run.root / command / "Cargo.toml").is_file() else ""
    if not (run.root / relative / "Cargo.toml").is_file():
        raise FdlError(crate_missing(str(run.root / relative), chosen, source))
    return relative


def prebuild(
    run: Run, command: str, crate: str, *, probe: bool = True, known: Sequence[HostVerdict] = ()
) -> Publication | None:
    """The whole pipeline; what it published (``None`` under --dry).

    Preflight checks the controller (the variants, the build tool, its images)
    beside the ssh probe; the builds are planned from what it found.
    ``probe=False`` (a watch cycle) skips preflight and plans from ``known``, an earlier
    preflight's verdicts (a host's probed CPU architecture above all), unless a host's
    arch is ``auto``: its choice is made from the probe, so such a run always probes;
    verification still runs, and the controller's checks too
    (:func:`~fdl_tasks.build.readiness_io.require_ready`).
    """
    require_verification_possible(run)
    verdicts: Sequence[HostVerdict] = known
    probe = (probe or any(w.arch == AUTO for w in run.remotes)) and not run.dry
    if run.dry:
        backend = run_backend(run)
        run.note_unlisted_controller()
        jobs = plan(run, backend, run.remotes, command, crate, cross_cpu_archs(run, known))
        for line in dry_run_lines(run, abi=True, crate=crate):
            run.report(line)
        run_builds(run, backend, jobs)
        return None
    with standing_by(run) as run, Fleet(run.remotes, run.settings, run.report) as fleet:
        backend = run_backend(run)
        run.note_unlisted_controller()
        records = build_records(run, backend)
        if probe:
            run, jobs, verdicts = probe_and_plan(run, fleet, backend, command, crate, records)
        else:
            jobs = plan(run, backend, run.remotes, command, crate, cross_cpu_archs(run, known))
            require_ready(run.root, backend, jobs)
        published = build_and_publish(run, fleet, backend, jobs, command, crate, records)
        return attrs.evolve(published, verdicts=tuple(verdicts))


@contextmanager
def standing_by(run: Run) -> Iterator[Run]:
    """The run with standbys of its own for its builds (:mod:`fdl_tasks.core.standbys`),
    each closed at the end if unused, and, if it succeeded, one parked for the next run
    in each container it built in (:mod:`fdl_tasks.build.parked_standbys`); a watch's run
    keeps its session's."""
    if run.standbys is not None or not run.settings.warm_containers:
        yield run
        return
    standbys = Standbys(run.c, Parking(str(run.root)))
    try:
        yield attrs.evolve(run, standbys=standbys)
    except BaseException:
        standbys.close()
        raise
    standbys.close(park=True)


def build_and_publish(
    run: Run,
    fleet: Fleet,
    backend: Backend,
    jobs: list[BuildJob],
    command: str,
    crate: str,
    records: Records | None = None,
) -> Publication:
    """The one publish path (prebuild, build-host, each watch cycle), under the project lock:
    read the merge base, withdraw the command's envelope, build, verify, merge, publish.

    The merge base is the published envelope, read under the lock so that a run
    publishing meanwhile is never overwritten by a stale copy: the entries of
    current hosts these jobs do not build are kept (build-host), the others are
    this run's. An envelope that cannot be read is an error naming the file when
    an entry of it would be kept; when every entry is rebuilt it is replaced, saying so.
    """
    workers = {w.host: w for w in run.remotes}
    envelopes = {
        host: PerHostEnvelope.for_worker(workers[host], command, crate, job.build.cpu_arch)
        for job in jobs
        for host in job.hosts
    }
    path = envelope.published_path(run.root, command)
    with project_lock(run.root / LOCK_FILE, run.report):
        # What a run killed while publishing left (the lock died with it).
        remove_partials(path)
        for job in jobs:
            for host in job.hosts:
                remove_partials(run.root / job.host_binary(host))
        kept = merge_base(run, command, set(workers) - set(envelopes))
        # Withdraw first: if this run fails, nothing may point a launcher at
        # binaries that are now stale.
        envelope.withdraw(run.root, command)
        # The hosts that will be asked log in while cargo works; each is asked as its
        # build ends, but a copy host, asked once its copy is uploaded.
        copies = {w.host for w in copy_hosts(run.cluster, run.remotes)}
        verify = run.settings.verify
        with (
            fleet.opening(h for h in envelopes if verify or h in copies),
            FirstAsks(fleet, envelopes, set(envelopes) - copies if verify else set()) as first,
        ):
            results = run_builds(run, backend, jobs, records, first.built)
            try:  # the builds' records are being written meanwhile
                built = {host: run.root / job.built_binary for job in jobs for host in job.hosts}
                digests = {run.root / r.job.built_binary: r.sha256 for r in results}
                copy_step(run, fleet, envelopes, built, digests)  # copy hosts: upload the missing
                known = {run.root / r.job.built_binary: r.facts for r in results if r.facts}
                verification = (
                    verify_hosts(run, fleet, envelopes, built, known, first) if verify else None
                )
            finally:
                results = settled(results)
        merged = kept | envelopes
        with step(run, "publish", command):
            text = envelope.publish(run.root, command, merged)
            write_sources(run.root, command, results, set(kept))
    run.say(f"envelope of {command} for {len(merged)} host(s) written to {path}")
    if not run.settings.verify:
        run.say(
            f"envelope of {command} published unverified (--no-verify or fdl.verify false): "
            "no host was asked whether it sees its binary and can load it"
        )
    return Publication(
        command=command,
        entries=merged,
        text=text,
        path=path,
        results=tuple(results),
        verification=verification,
    )


def merge_base(run: Run, command: str, keep: set[str]) -> dict[str, PerHostEnvelope]:
    """The published entries of the hosts in ``keep`` (call under the project lock)."""
    path = envelope.published_path(run.root, command)
    try:
        published = envelope.read_file(path)
    except FdlError as exc:
        if keep:
            raise FdlError(
                f"{exc}\nthe entries of {', '.join(sorted(keep))} would be kept from it, "
                f"so nothing was built: fix or remove {path}, or rebuild every host "
                f"with inv prebuild --cmd {command}"
            ) from None
        run.say(f"the published envelope cannot be read, replacing it: {exc}", Severity.WARNING)
        return {}
    return {host: entry for host, entry in (published or {}).items() if host in keep}


def build_one(run: Run, worker: Worker, command: str, crate: str) -> Publication | None:
    """``build-host``: one host's build, verified; its entry replaces its old one in the
    command's envelope (the other current hosts' entries still match their binaries).

    That host alone is probed first, with the controller's checks beside it, as
    prebuild probes every host: its CPU architecture when ``cpu_arch`` does not pin
    it, its paths, its GPUs against the variant."""
    require_verification_possible(run)
    backend = run_backend(run)
    alone = attrs.evolve(run, cluster=run.cluster.keeping({worker.host, run.controller}))
    if run.dry:
        jobs = plan(alone, backend, [worker], command, crate, cross_cpu_archs(alone))
        run_builds(run, backend, [attrs.evolve(job, name=worker.host) for job in jobs])
        return None
    with Fleet([worker], run.settings, run.report) as fleet:
        alone, jobs, _ = probe_and_plan(alone, fleet, backend, command, crate)
        # Its entry as probed (an ``arch: auto`` chosen), the others' as they are.
        run = attrs.evolve(run, cluster=run.cluster.replacing(alone.cluster.worker(worker.host)))
        jobs = [attrs.evolve(job, name=worker.host) for job in jobs]
        return build_and_publish(run, fleet, backend, jobs, command, crate)
