"""Run the preflight probe: remote hosts over one Fabric fan-out, the controller locally."""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import yaml

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.readiness_io import controller_arch_problem, controller_problems
from fdl_tasks.config.launch_mode import COMPOSE_FILES, forwarding_warning, forwards, launch_mode
from fdl_tasks.config.model import Cluster, ComposeService, Controller, Worker
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.launch_facts import literal_address, loopback_warning
from fdl_tasks.preflight.gpu_gate import gate
from fdl_tasks.preflight.login_verdicts import failed_verdict
from fdl_tasks.preflight.nccl import nccl_skew
from fdl_tasks.preflight.probe import (
    ControllerAbi,
    HostVerdict,
    ProbeRequest,
    Status,
    judge,
    parse_facts,
    unreachable,
)
from fdl_tasks.ssh.gateways import plan, unknown_labels
from fdl_tasks.ssh.outcomes import Failure
from fdl_tasks.ssh.remote import Fleet
from fdl_tasks.timings.recording import round_trips, step


def controller_abi(cross: Iterable[str] = ()) -> ControllerAbi:
    """The controller's machine and glibc: what a native or Docker build targets.

    Docker images run on the controller's kernel, so the CPU architecture is
    the controller's. Their glibc may differ from the controller's; the
    binary's real glibc needs are checked from its ELF after the build.
    """
    glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    parts = glibc.split()[-1].split(".")[:2] if glibc.startswith("glibc") else []
    version = (int(parts[0]), int(parts[1])) if len(parts) == 2 else None
    return ControllerAbi(platform.machine(), version, frozenset(cross))


def controller_entry(cluster: Cluster, label: str) -> Worker | Controller:
    """The controller's own worker entry if it has one, else the ``controller`` block."""
    return next((w for w in cluster.workers if w.host == label), cluster.controller)


def controller_request(cluster: Cluster, label: str) -> ProbeRequest:
    """What the controller is asked, locally: its data path only (it is the build host;
    its own directories are :mod:`fdl_tasks.build.readiness`'s)."""
    return attrs.evolve(ProbeRequest.for_host(controller_entry(cluster, label), False), paths=None)


def probe_controller(cluster: Cluster, label: str, settings: Settings) -> HostVerdict:
    """The controller is the build host: only its data path needs asking, locally (its
    other checks are :func:`fdl_tasks.build.readiness_io.controller_problems`)."""
    request = controller_request(cluster, label)
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
    return judge(label, request, facts, controller_abi(), local=True)


def probe_remotes(
    fleet: Fleet,
    workers: tuple[Worker, ...],
    settings: Settings,
    abi: bool,
    cross: Iterable[str],
    root: Path | None = None,
    crate: str | None = None,
    source: str = "cluster.yaml",
) -> list[HostVerdict]:
    """One round trip per remote host, all in parallel; unreachable is a warning, a
    misconfigured login an error (:mod:`fdl_tasks.preflight.login_verdicts`).

    ``root``: the controller's project root, whose variants' ``.arch`` files the
    GPU gate reads (:mod:`fdl_tasks.preflight.gpu_gate`). ``crate``: the command's crate dir,
    when known, whose directory each shared host must see."""
    requests = {w.host: ProbeRequest.for_host(w, abi, crate, source) for w in workers}
    outcomes = fleet.run({h: r.script() for h, r in requests.items()}, settings.probe_timeout)
    controller = controller_abi(cross)
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
            verdict = judge(host, request, facts, controller, pinned=by_host[host].cpu_arch)
            if root is not None:
                verdict = gate(verdict, by_host[host], root)
        verdicts.append(verdict)
    return verdicts


def dry_run_lines(run: Run, *, abi: bool, crate: str | None = None) -> list[str]:
    """What preflight would run, for ``inv --dry``: one line per host, each exactly the
    script the real run sends."""

    def one_line(request: ProbeRequest) -> str:
        return shlex.quote(request.script().replace("\n", "; "))

    local = one_line(controller_request(run.cluster, run.controller))
    lines = [f"[{run.controller}] (local) sh -c {local}"]
    routes = plan(run.settings.gateways, run.remotes)
    for worker in run.remotes:
        port = worker.ssh.port or 22
        user = f"{worker.ssh.user}@" if worker.ssh.user else ""
        request = ProbeRequest.for_host(worker, abi, crate, run.cluster.source)
        if route := routes.route_of(worker.host):  # the gateway's ssh config says the rest
            where = f"gateway {route.said}, then ssh {worker.ssh_target}"
        else:
            where = f"ssh {user}{worker.ssh_target}:{port}"
        lines.append(f"[{worker.host}] {where} {one_line(request)}")
    return lines


def cross_cpu_archs(run: Run, verdicts: Sequence[HostVerdict] = ()) -> dict[str, str]:
    """Hosts whose CPU architecture (``cpu_arch``, else preflight's ``uname -m``) is not
    the controller's: they get cross builds."""
    native = controller_abi().cpu_arch
    seen = {v.host: v.facts.cpu_arch for v in verdicts if v.facts and v.facts.cpu_arch}
    cpu_archs = {w.host: w.cpu_arch or seen.get(w.host) for w in run.remotes}
    return {host: cpu for host, cpu in cpu_archs.items() if cpu and cpu != native}


def run_preflight(
    run: Run,
    fleet: Fleet,
    backend: Backend,
    *,
    abi: bool,
    crate: str | None = None,
    beside: Callable[[], object] | None = None,
) -> list[HostVerdict]:
    """Every host's verdict: the controller first, then remotes in cluster.yaml order.

    The controller's checks (``controller.path``; with ``abi``, what the builds need:
    variants, the build tool, images, a cross target's ``std``) overlap the ssh
    probe and end up as errors of the controller's verdict. They assume the pinned
    CPU architectures; a host whose probe says otherwise has them asked again.
    ``beside`` runs after those checks found nothing, while the probe goes on
    (a prebuild's looks); preflight ends when it has.
    """
    remotes, source = run.remotes, run.cluster.source
    unknown_labels(run.settings.gateways, [w.host for w in run.cluster.workers])
    run.report(
        f"preflight: probing {len(remotes)} remote host(s)"
        + (" with the ABI gate" if abi else "")
        + " and the controller locally"
    )
    builds = remotes if abi else ()
    cross = run.cluster.controller.cross
    pinned = {h: c for h, c in cross_cpu_archs(run).items() if c in cross}
    with ThreadPoolExecutor(3) as side:
        checked = side.submit(controller_problems, run.root, source, backend, builds, pinned)
        loopback = side.submit(controller_loopback, run.cluster, remotes)
        ahead = side.submit(lambda: checked.result() or (beside and beside()))
        with step(run, "preflight", run.controller):
            local = probe_controller(run.cluster, run.controller, run.settings)
        with round_trips(run, fleet, "preflight"):
            verdicts = probe_remotes(
                fleet, remotes, run.settings, abi, cross, run.root, crate, source
            )
        problems = checked.result()
        ahead.result()
    probed = {h: c for h, c in cross_cpu_archs(run, verdicts).items() if c in cross}
    if abi and probed != pinned:
        problems = controller_problems(run.root, source, backend, builds, probed)
    arch = controller_arch_problem(run.root, run.cluster.controller.arch, source)
    warnings = [w for w in (loopback.result(), arch) if w] + compose_forwarding(run)
    skew = nccl_skew({v.host: v.facts.nccl if v.facts else None for v in verdicts})
    if skew is not None:
        (problems if run.settings.nccl_mismatch == "error" else warnings).append(skew)
    return [with_problems(local, problems, warnings), *verdicts]


def compose_forwarding(run: Run) -> list[str]:
    """A warning when flodl's launcher will run in a compose service that does not pass
    the envelope's variable into its container (read from the compose file itself: a
    file compose cannot read is the backend's check)."""
    service = run.cluster.controller.docker
    if not isinstance(service, ComposeService):
        return []
    try:
        mode = launch_mode(run.settings.launcher, run.cluster.origin, run.cluster.source)
    except FdlError:
        return []  # said by launch itself
    found = next((run.root / n for n in COMPOSE_FILES if (run.root / n).is_file()), None)
    if mode != "fdl" or found is None:
        return []
    try:
        data = yaml.safe_load(found.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    return (
        [] if forwards(data, service.service) else [forwarding_warning(str(found), service.service)]
    )


def with_problems(
    verdict: HostVerdict, errors: Sequence[str], warnings: Sequence[str]
) -> HostVerdict:
    """The verdict with these errors and warnings added, its status following them."""
    if not errors and not warnings:
        return verdict
    status: Status = "error" if errors or verdict.status == "error" else "warning"
    return attrs.evolve(
        verdict,
        status=status,
        errors=(*verdict.errors, *errors),
        warnings=(*verdict.warnings, *warnings),
    )


def resolve(name: str) -> tuple[str, ...] | None:
    """The addresses ``name`` resolves to here (a literal IP is itself); ``None`` when it
    does not resolve."""
    if (literal := literal_address(name)) is not None:
        return (literal,)
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # socket.gaierror is an OSError
        return None
    return tuple(dict.fromkeys(str(info[4][0]) for info in found))


def controller_loopback(cluster: Cluster, remotes: Sequence[Worker]) -> str | None:
    """:func:`~fdl_tasks.gpu.launch_facts.loopback_warning`, its names resolved on this machine.

    A tunneled worker (``tunnel: true``) dials its own loopback forward, not
    ``controller.host``: it is left out. Worker targets are resolved only while needed.
    """
    host = cluster.controller.host
    if not isinstance(host, str) or not host:
        return None
    targets = (
        (w.host, w.ssh_target, resolve(w.ssh_target)) for w in remotes if w.tunnel is not True
    )
    return loopback_warning(host, resolve(host), targets)
