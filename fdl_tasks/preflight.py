"""Run the preflight probe: remote hosts over one Fabric fan-out, the controller locally."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

from fdl_tasks.gpu_gate import gate
from fdl_tasks.login_verdicts import failed_verdict
from fdl_tasks.model import Cluster, Controller, Worker
from fdl_tasks.outcomes import Failure
from fdl_tasks.probe import (
    BuildEnvironment,
    ProbeRequest,
    Verdict,
    judge,
    parse_facts,
    unreachable,
)
from fdl_tasks.remote import Fleet
from fdl_tasks.run import Run
from fdl_tasks.settings import Settings
from fdl_tasks.timings import round_trips, step


def local_build_environment(cross: Iterable[str] = ()) -> BuildEnvironment:
    """The controller's machine and glibc: what a native or Docker build targets.

    Docker images run on the controller's kernel, so the CPU architecture is
    the controller's. Their glibc may differ from the controller's; the
    binary's real glibc needs are checked from its ELF after the build.
    """
    glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    parts = glibc.split()[-1].split(".")[:2] if glibc.startswith("glibc") else []
    version = (int(parts[0]), int(parts[1])) if len(parts) == 2 else None
    return BuildEnvironment(platform.machine(), version, frozenset(cross))


def controller_entry(cluster: Cluster, label: str) -> Worker | Controller:
    """The controller's own worker entry if it has one, else the ``controller`` block."""
    return next((w for w in cluster.workers if w.host == label), cluster.controller)


def probe_controller(cluster: Cluster, label: str, settings: Settings) -> Verdict:
    """The controller is the build host: only its data path needs checking, locally."""
    request = ProbeRequest.for_host(controller_entry(cluster, label), abi=False)
    try:
        done = subprocess.run(
            ["sh", "-c", request.script()],
            capture_output=True,
            text=True,
            timeout=settings.probe_timeout,
            check=False,
        )
        facts = parse_facts(done.stdout)
    except subprocess.TimeoutExpired:
        facts = None
    return judge(label, request, facts, local_build_environment(), local=True)


def probe_remotes(
    fleet: Fleet,
    workers: tuple[Worker, ...],
    settings: Settings,
    abi: bool,
    cross: Iterable[str],
    root: Path | None = None,
) -> list[Verdict]:
    """One round trip per remote host, all in parallel; unreachable is a warning, a
    misconfigured login an error (:mod:`fdl_tasks.login_verdicts`).

    ``root``: the controller's project root, whose variants' ``.arch`` files the
    GPU gate reads (:mod:`fdl_tasks.gpu_gate`)."""
    requests = {w.host: ProbeRequest.for_host(w, abi) for w in workers}
    outcomes = fleet.run({h: r.script() for h, r in requests.items()}, settings.probe_timeout)
    build = local_build_environment(cross)
    pins = {w.host: w.cpu_arch for w in workers}
    by_host = {w.host: w for w in workers}
    verdicts = []
    for host, request in requests.items():
        outcome = outcomes[host]
        if isinstance(outcome, Failure):
            verdict = failed_verdict(host, request.data_path, outcome, settings.ssh_login_errors)
        elif outcome.exited != 0:
            verdict = unreachable(
                host, request, f"the probe exited {outcome.exited}: {outcome.stderr.strip()[-200:]}"
            )
        else:
            facts = parse_facts(outcome.stdout)
            verdict = judge(host, request, facts, build, pinned=pins[host])
            if root is not None:
                verdict = gate(verdict, by_host[host], root)
        verdicts.append(verdict)
    return verdicts


def dry_run_lines(run: Run, *, abi: bool) -> list[str]:
    """What preflight would run, for ``inv --dry``: one line per host."""

    def one_line(host: Worker | Controller) -> str:
        return shlex.quote(ProbeRequest.for_host(host, abi).script().replace("\n", "; "))

    entry = controller_entry(run.cluster, run.controller)
    lines = [f"[{run.controller}] (local) sh -c {one_line(entry)}"]
    for worker in run.remotes:
        port = worker.ssh.port or 22
        user = f"{worker.ssh.user}@" if worker.ssh.user else ""
        lines.append(f"[{worker.host}] ssh {user}{worker.ssh_target}:{port} {one_line(worker)}")
    return lines


def run_preflight(run: Run, fleet: Fleet, *, abi: bool) -> list[Verdict]:
    """Every host's verdict: the controller first, then remotes in cluster.yaml order."""
    remotes = run.remotes
    run.report(
        f"preflight: probing {len(remotes)} remote host(s)"
        + (" with the ABI gate" if abi else "")
        + " and the controller locally"
    )
    with step(run, "preflight", run.controller):
        local = probe_controller(run.cluster, run.controller, run.settings)
    with round_trips(run, fleet, "preflight"):
        cross = run.cluster.controller.cross
        return [local, *probe_remotes(fleet, remotes, run.settings, abi, cross, run.root)]
