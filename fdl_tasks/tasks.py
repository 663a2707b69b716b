"""The Invoke tasks: thin wrappers that read settings, call the logic, report.

Progress and diagnostics go to stderr; stdout carries only what ``--json``
asks for. Every :class:`FdlError` becomes one paragraph and exit code 1.
"""

from __future__ import annotations

import functools
import json as jsonlib
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from fdl_tasks.builder import (
    Builder,
    JobResult,
    check_cargo,
    check_docker,
    failure_report,
    stop_containers,
    write_atomically,
)
from fdl_tasks.delivery import verify_delivery
from fdl_tasks.envelope import ENV_PREBUILD_PER_HOST, PerHostEnvelope, decode, encode
from fdl_tasks.errors import FdlError
from fdl_tasks.launch import check_envelopes, launch_all, launch_command
from fdl_tasks.loader import load_cluster
from fdl_tasks.model import Cluster, Worker
from fdl_tasks.plan import BuildJob, plan_builds
from fdl_tasks.preflight import dry_run_lines, run_preflight
from fdl_tasks.probe import Verdict, report_lines
from fdl_tasks.remote import Fleet
from fdl_tasks.rules import (
    HOST_NAME_ENV,
    check_command,
    check_crate_dir,
    controller_label,
    remote_workers,
)
from fdl_tasks.settings import DEFAULTS, Settings

F = TypeVar("F", bound=Callable[..., Any])

COMMON_HELP = {
    "cluster-file": "cluster.yaml to read (default: fdl.cluster_file, 'cluster.yaml')",
    "controller-host": "this machine's host label (default: $FLODL_HOST_NAME, else hostname)",
    "json": "print a machine-readable result on stdout",
}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def user_errors(body: F) -> F:
    """Turn :class:`FdlError` into a clean message and exit 1, never a traceback."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except FdlError as exc:
            raise Exit(f"fdl: {exc}", code=1) from None
        except KeyboardInterrupt:
            raise Exit("fdl: interrupted", code=130) from None

    return wrapper  # type: ignore[return-value]


def _load(c: Context, **options: Any) -> tuple[Settings, Cluster, str]:
    settings = Settings.from_config(c.config.get("fdl", {}), **options)
    cluster = load_cluster(settings.cluster_file)
    label = controller_label(
        settings.controller_host, os.environ.get(HOST_NAME_ENV), socket.gethostname()
    )
    return settings, cluster, label


def _report_preflight(verdicts: list[Verdict], as_json: bool) -> None:
    for line in report_lines(verdicts):
        say(line)
    if as_json:
        print(jsonlib.dumps([v.to_json() for v in verdicts], indent=2))
    failed = [v.host for v in verdicts if v.status == "error"]
    if failed:
        raise FdlError(f"preflight found errors on {', '.join(failed)}; nothing was built")


@task(
    help={
        **COMMON_HELP,
        "no-prebuild": "check only the data paths, not the ABI gate (no binary will ship)",
    }
)
@user_errors
def preflight(
    c: Context,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    no_prebuild: bool = False,
    json: bool = False,
) -> None:
    """Probe every host (ssh, in parallel) for readiness before any build."""
    settings, cluster, label = _load(c, cluster_file=cluster_file, controller_host=controller_host)
    if c.config.run.dry:
        for line in dry_run_lines(cluster, label, abi=not no_prebuild):
            say(line)
        return
    with Fleet(remote_workers(cluster, label), settings, say) as fleet:
        verdicts = run_preflight(cluster, label, settings, fleet, not no_prebuild, say)
    _report_preflight(verdicts, json)


def _crate_dir(option: str | None, settings: Settings, cluster: Cluster, command: str) -> str:
    """Option, else setting, else ``<root>/<command>`` when it is a crate, else the root."""
    chosen = option if option is not None else settings.crate_dir
    if chosen:
        relative = check_crate_dir(chosen)
    else:
        own_crate = Path(cluster.controller.path, command, "Cargo.toml").is_file()
        relative = command if own_crate else ""
    if not Path(cluster.controller.path, relative, "Cargo.toml").is_file():
        raise FdlError(
            f"no Cargo.toml in {Path(cluster.controller.path, relative)}: pass "
            "--crate-dir relative to controller.path"
        )
    return relative


def _check_tools(cluster: Cluster, jobs: list[BuildJob]) -> None:
    docker = cluster.controller.docker
    if docker is None:
        check_cargo()
    else:
        check_docker(docker, [job.spec.image for job in jobs if job.spec.image])


def _summary(results: list[JobResult], cluster: Cluster) -> list[str]:
    rows = [("host", "arch", "build", "result", "seconds", "log")]
    for result in results:
        job = result.job
        build = f"shared by {len(job.hosts)}" if len(job.hosts) > 1 else "own"
        for host in job.hosts:
            rows.append(
                (
                    host,
                    job.spec.arch,
                    build,
                    "ok" if result.ok else "FAILED",
                    f"{result.seconds:.1f}",
                    f"{cluster.controller.path}/{job.log_file}",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


@task(
    help={
        **COMMON_HELP,
        "host": "the worker's host label in cluster.yaml",
        "cmd": "the command to build (cargo --bin name)",
        "crate-dir": "crate directory relative to controller.path (default: <cmd>/ if it "
        "holds a Cargo.toml, else the project root)",
    }
)
@user_errors
def build_host(
    c: Context,
    host: str,
    cmd: str,
    crate_dir: str | None = None,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    json: bool = False,
) -> None:
    """Build one host's binary against its own libtorch; print its envelope entry."""
    settings, cluster, label = _load(c, cluster_file=cluster_file, controller_host=controller_host)
    worker = cluster.worker(host)
    if worker.host == label:
        raise FdlError(f"{host!r} is the controller: its build is the normal local build")
    command = check_command(cmd)
    crate = _crate_dir(crate_dir, settings, cluster, command)
    jobs = plan_builds([worker], cluster.controller.docker, command, crate, shared=False)
    _check_tools(cluster, jobs)
    builder = Builder(c, cluster, secrets.token_hex(4), settings.build_timeout, 1)
    result = builder.run_one(jobs[0])
    if not result.ok:
        raise FdlError(failure_report(result, cluster))
    entry = PerHostEnvelope.for_worker(worker, command, crate)
    say(f"built {host} in {result.seconds:.1f}s: {entry.bin}")
    if json:
        print(encode({host: entry}))


@task(
    help={
        **COMMON_HELP,
        "cmd": "the command to build (cargo --bin name)",
        "crate-dir": "crate directory relative to controller.path (default: <cmd>/ if it "
        "holds a Cargo.toml, else the project root)",
        "jobs": "how many builds may run at once (default: fdl.build_jobs, else one per core)",
        "no-prebuild": "run only the data-path preflight; build and publish nothing",
        "per-host": "one build per host even where builds are identical (full isolation)",
        "timeout": "seconds one build may take (default: fdl.build_timeout)",
    }
)
@user_errors
def prebuild(
    c: Context,
    cmd: str,
    crate_dir: str | None = None,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    jobs: int | None = None,
    no_prebuild: bool = False,
    per_host: bool = False,
    no_verify: bool = False,
    timeout: float | None = None,
    json: bool = False,
) -> None:
    """Preflight, then build CMD once per remote libtorch variant and publish the envelope."""
    settings, cluster, label = _load(
        c,
        cluster_file=cluster_file,
        controller_host=controller_host,
        build_jobs=jobs,
        build_timeout=timeout,
        shared_builds=False if per_host else None,
        verify=False if no_verify else None,
    )
    command = check_command(cmd)
    remotes = remote_workers(cluster, label)
    if no_prebuild:
        remotes_plan: list[BuildJob] = []
        crate = ""
    else:
        crate = _crate_dir(crate_dir, settings, cluster, command)
        remotes_plan = plan_builds(
            remotes, cluster.controller.docker, command, crate, settings.shared_builds
        )
    if c.config.run.dry:
        for line in dry_run_lines(cluster, label, abi=not no_prebuild):
            say(line)
        _build(c, cluster, settings, remotes_plan, remotes)
        return
    with Fleet(remotes, settings, say) as fleet:
        verdicts = run_preflight(cluster, label, settings, fleet, not no_prebuild, say)
        _report_preflight(verdicts, as_json=False)
        if no_prebuild:
            return
        envelope_path = Path(cluster.controller.path, settings.envelope_file)
        # Withdraw the previous envelope first: if this run fails, nothing may
        # point a launcher at binaries that are now stale.
        envelope_path.unlink(missing_ok=True)
        os.environ.pop(ENV_PREBUILD_PER_HOST, None)
        _build(c, cluster, settings, remotes_plan, remotes)
        envelopes = {w.host: PerHostEnvelope.for_worker(w, command, crate) for w in remotes}
        if settings.verify:
            problems = verify_delivery(fleet, cluster.controller.path, envelopes, settings, say)
            if problems:
                raise FdlError(
                    "delivery verification failed; no envelope was published.\n"
                    + "\n".join(f"  {p}" for p in problems)
                )
            say(f"verify: {len(envelopes)} host(s) see the same bytes, every library resolves")
    text = encode(envelopes)
    os.environ[ENV_PREBUILD_PER_HOST] = text
    write_atomically(envelope_path, text + "\n")
    say(
        f"prebuild: envelope for {len(remotes)} host(s) written to {envelope_path} and "
        f"${ENV_PREBUILD_PER_HOST}"
    )
    if json:
        print(text)


def _build(
    c: Context,
    cluster: Cluster,
    settings: Settings,
    jobs: list[BuildJob],
    remotes: tuple[Worker, ...],
) -> None:
    """Run every build to its end; raise with every failure's diagnostic together."""
    run_id = secrets.token_hex(4)
    builder = Builder(c, cluster, run_id, settings.build_timeout, settings.jobs)
    if c.config.run.dry:
        for job in jobs:
            say(f"[{job.name}] {builder.command(job)}")
        return
    _check_tools(cluster, jobs)
    say(
        f"prebuild: {len(jobs)} build(s) for {len(remotes)} remote host(s), "
        f"{settings.jobs} at a time"
    )

    def finished(result: JobResult) -> None:
        state = "ok" if result.ok else f"FAILED ({result.detail})"
        say(f"prebuild: {result.job.name} {state} in {result.seconds:.1f}s")

    try:
        results = builder.run_all(jobs, finished)
    except KeyboardInterrupt:
        stopped = stop_containers(run_id) if cluster.controller.docker else 0
        raise FdlError(
            f"interrupted: stopped {stopped} build container(s); no envelope was published"
        ) from None
    for line in _summary(results, cluster):
        say(line)
    failures = [r for r in results if not r.ok]
    if failures:
        raise FdlError(
            f"{len(failures)} of {len(results)} build(s) failed; no envelope was "
            "published.\n" + "\n".join(failure_report(r, cluster) for r in failures)
        )


def _read_envelopes(settings: Settings, cluster: Cluster) -> tuple[str, str]:
    """The envelope text and where it came from: the environment, else prebuild's file."""
    text = os.environ.get(ENV_PREBUILD_PER_HOST)
    if text:
        return text, f"${ENV_PREBUILD_PER_HOST}"
    path = Path(cluster.controller.path, settings.envelope_file)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise FdlError(
            f"no envelope: neither ${ENV_PREBUILD_PER_HOST} nor {path} exists; run prebuild first"
        ) from None


def _remainder_args() -> list[str]:
    """Arguments after ``--`` on the ``inv`` command line, exactly as the shell split them.

    Invoke only keeps the remainder as one space-joined string, which would
    lose quoting, so the task reads them from ``sys.argv`` itself.
    """
    return sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []


@task(
    help={
        "cluster-file": COMMON_HELP["cluster-file"],
        "controller-host": COMMON_HELP["controller-host"],
        "cmd": "the command whose prebuilt binary to run",
    }
)
@user_errors
def launch(
    c: Context, cmd: str, cluster_file: str | None = None, controller_host: str | None = None
) -> None:
    """Run the prebuilt CMD on every remote worker (arguments after --); lines prefixed [host]."""
    settings, cluster, label = _load(c, cluster_file=cluster_file, controller_host=controller_host)
    remotes = remote_workers(cluster, label)
    text, source = _read_envelopes(settings, cluster)
    envelopes = decode(text, source)
    problems = check_envelopes(envelopes, remotes, cmd, source)
    if problems:
        raise FdlError(
            "the envelope does not match cluster.yaml (stale? run prebuild "
            "again): " + "; ".join(problems)
        )
    args = _remainder_args()
    if c.config.run.dry:
        for worker in remotes:
            command = launch_command(worker, envelopes[worker.host], cluster.env, args)
            say(f"[{worker.host}] {command}")
        return
    with Fleet(remotes, settings, say) as fleet:
        failed = launch_all(fleet, cluster, envelopes, args)
    if failed:
        raise FdlError("launch failed on " + ", ".join(f"{h} ({why})" for h, why in failed.items()))
    say(f"launch: {cmd} finished on {len(remotes)} host(s)")


ns = Collection(preflight, build_host, prebuild, launch)
ns.configure({"fdl": dict(DEFAULTS)})
