"""The prebuild pipeline: preflight, builds, verification, publication.

Tasks call these with a :class:`~fdl_tasks.run.Run`; each step reports
progress through ``run.report`` and raises :class:`FdlError` with every
problem of its step together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fdl_tasks.builds import check_tools, run_builds
from fdl_tasks.delivery import verify_delivery
from fdl_tasks.envelope import ENV_PREBUILD_PER_HOST, PerHostEnvelope, encode
from fdl_tasks.errors import FdlError
from fdl_tasks.files import project_lock, write_atomically
from fdl_tasks.model import Worker
from fdl_tasks.plan import BuildJob, plan_builds
from fdl_tasks.preflight import dry_run_lines, local_build_environment, run_preflight
from fdl_tasks.probe import Verdict, report_lines
from fdl_tasks.remote import Fleet
from fdl_tasks.rules import CLUSTER_TARGET, check_crate_dir
from fdl_tasks.run import Run


def report_preflight(run: Run, verdicts: Sequence[Verdict], as_json: bool) -> None:
    """One line per host and a summary; an error on any host stops everything."""
    for line in report_lines(verdicts):
        run.report(line)
    if as_json:
        print(json.dumps([v.to_json() for v in verdicts], indent=2))
    failed = [v.host for v in verdicts if v.status == "error"]
    if failed:
        raise FdlError(f"preflight found errors on {', '.join(failed)}; nothing was built")


def preflight(run: Run, abi: bool, as_json: bool) -> None:
    """The readiness probe alone (``inv preflight``, ``prebuild --no-prebuild``)."""
    if run.dry:
        for line in dry_run_lines(run, abi):
            run.report(line)
        return
    with Fleet(run.remotes, run.settings, run.report) as fleet:
        verdicts = run_preflight(run, fleet, abi)
    report_preflight(run, verdicts, as_json)


def resolve_crate_dir(run: Run, option: str | None, command: str) -> str:
    """Option, else setting, else ``<root>/<command>`` when it is a crate, else the root."""
    chosen = option if option is not None else run.settings.crate_dir
    if chosen:
        relative = check_crate_dir(chosen)
    else:
        relative = command if (run.root / command / "Cargo.toml").is_file() else ""
    if not (run.root / relative / "Cargo.toml").is_file():
        raise FdlError(
            f"no Cargo.toml in {run.root / relative}: pass --crate-dir relative to controller.path"
        )
    return relative


def envelope_path(run: Run) -> Path:
    return run.root / run.settings.envelope_file


def host_machines(run: Run, verdicts: Sequence[Verdict] = ()) -> dict[str, str]:
    """Hosts whose CPU architecture (``cpu_arch``, else preflight's ``uname -m``) is not the
    controller's: they get cross builds."""
    native = local_build_environment().machine
    seen = {v.host: v.facts.uname_m for v in verdicts if v.facts and v.facts.uname_m}
    machines = {w.host: w.cpu_arch or seen.get(w.host) for w in run.remotes}
    return {host: m for host, m in machines.items() if m and m != native}


def plan(run: Run, command: str, crate: str, machines: dict[str, str]) -> list[BuildJob]:
    controller = run.cluster.controller
    return plan_builds(
        run.remotes,
        controller.docker,
        command,
        crate,
        run.settings.shared_builds,
        machines=machines,
        cross=controller.cross,
    )


def prebuild(run: Run, command: str, crate: str) -> str | None:
    """The whole pipeline; returns the published envelope text (``None`` under --dry).

    Builds are planned from the pinned CPU architectures so that the tool checks
    overlap the ssh probe, and planned again if preflight found others.
    """
    pinned = host_machines(run)
    jobs = plan(run, command, crate, pinned)
    if run.dry:
        for line in dry_run_lines(run, abi=True):
            run.report(line)
        run_builds(run, jobs)
        return None
    with Fleet(run.remotes, run.settings, run.report) as fleet, ThreadPoolExecutor(1) as side:
        tools = side.submit(check_tools, run.cluster, jobs)  # local checks overlap the ssh probe
        verdicts = run_preflight(run, fleet, True)
        report_preflight(run, verdicts, False)
        compose_argv = tools.result()
        machines = host_machines(run, verdicts)
        if machines != pinned:
            jobs = plan(run, command, crate, machines)
            compose_argv = check_tools(run.cluster, jobs)
        with project_lock(run.root / CLUSTER_TARGET / "_prebuild.lock", run.report):
            # Withdraw the previous envelope first: if this run fails, nothing
            # may point a launcher at binaries that are now stale.
            envelope_path(run).unlink(missing_ok=True)
            os.environ.pop(ENV_PREBUILD_PER_HOST, None)
            run_builds(run, jobs, compose_argv)
            workers = {w.host: w for w in run.remotes}
            envelopes = {
                host: PerHostEnvelope.for_worker(
                    workers[host], command, crate, job.spec.machine_suffix
                )
                for job in jobs
                for host in job.hosts
            }
            if run.settings.verify:
                built = {host: run.root / job.built_binary for job in jobs for host in job.hosts}
                verify(run, fleet, envelopes, built)
            return publish(run, envelopes)


def verify(
    run: Run, fleet: Fleet, envelopes: dict[str, PerHostEnvelope], built: dict[str, Path]
) -> None:
    problems = verify_delivery(fleet, envelopes, built, run.settings, run.report)
    if problems:
        raise FdlError(
            "delivery verification failed; no envelope was published.\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    run.report(f"verify: {len(envelopes)} host(s) see the same bytes, every library resolves")


def publish(run: Run, envelopes: dict[str, PerHostEnvelope]) -> str:
    """Own process environment (for composed tasks and launchers), then the file."""
    text = encode(envelopes)
    path = envelope_path(run)
    write_atomically(path, text + "\n")
    os.environ[ENV_PREBUILD_PER_HOST] = text
    run.report(
        f"prebuild: envelope for {len(envelopes)} host(s) written to {path} and "
        f"${ENV_PREBUILD_PER_HOST}"
    )
    return text


def build_one(run: Run, worker: Worker, command: str, crate: str) -> PerHostEnvelope:
    """``build-host``: one host's build, its envelope entry on success."""
    machine = host_machines(run).get(worker.host)
    controller = run.cluster.controller
    jobs = plan_builds(
        [worker],
        controller.docker,
        command,
        crate,
        shared=False,
        machines={worker.host: machine} if machine else None,
        cross=controller.cross,
    )
    run_builds(run, jobs)
    return PerHostEnvelope.for_worker(worker, command, crate, machine)


def read_envelopes(run: Run) -> tuple[str, str]:
    """The envelope text and where it came from: the environment, else prebuild's file."""
    text = os.environ.get(ENV_PREBUILD_PER_HOST)
    if text:
        return text, f"${ENV_PREBUILD_PER_HOST}"
    path = envelope_path(run)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise FdlError(
            f"no envelope: neither ${ENV_PREBUILD_PER_HOST} nor {path} exists; run prebuild first"
        ) from None
    except OSError as exc:
        raise FdlError(f"cannot read the envelope {path}: {exc}") from None
