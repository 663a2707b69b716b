"""The prebuild pipeline: preflight, builds, verification, publication.

Tasks call these; each step reports progress through ``say`` (stderr) and
raises :class:`FdlError` with every problem of its step together.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from invoke.context import Context

from fdl_tasks.builder import Builder, JobResult, check_cargo, failure_report
from fdl_tasks.console import StatusBoard, format_table
from fdl_tasks.containers import (
    check_docker,
    compose_images,
    create_compose_networks,
    find_compose,
)
from fdl_tasks.delivery import verify_delivery
from fdl_tasks.envelope import ENV_PREBUILD_PER_HOST, PerHostEnvelope, encode
from fdl_tasks.errors import FdlError
from fdl_tasks.files import project_lock, write_atomically
from fdl_tasks.model import Cluster, ComposeService, DockerSettings, Worker
from fdl_tasks.plan import RUN_LABEL, BuildJob, compose_environment, plan_builds
from fdl_tasks.preflight import dry_run_lines, run_preflight
from fdl_tasks.probe import Verdict, report_lines
from fdl_tasks.remote import Fleet
from fdl_tasks.rules import CLUSTER_TARGET, check_crate_dir, remote_workers
from fdl_tasks.settings import Settings

Say = Callable[[str], None]


def report_preflight(verdicts: Sequence[Verdict], as_json: bool, say: Say) -> None:
    """One line per host and a summary; an error on any host stops everything."""
    for line in report_lines(verdicts):
        say(line)
    if as_json:
        print(json.dumps([v.to_json() for v in verdicts], indent=2))
    failed = [v.host for v in verdicts if v.status == "error"]
    if failed:
        raise FdlError(f"preflight found errors on {', '.join(failed)}; nothing was built")


def resolve_crate_dir(
    option: str | None, settings: Settings, cluster: Cluster, command: str
) -> str:
    """Option, else setting, else ``<root>/<command>`` when it is a crate, else the root."""
    chosen = option if option is not None else settings.crate_dir
    root = Path(cluster.controller.path)
    if chosen:
        relative = check_crate_dir(chosen)
    else:
        relative = command if (root / command / "Cargo.toml").is_file() else ""
    if not (root / relative / "Cargo.toml").is_file():
        raise FdlError(
            f"no Cargo.toml in {root / relative}: pass --crate-dir relative to controller.path"
        )
    return relative


def check_tools(cluster: Cluster, jobs: Sequence[BuildJob]) -> tuple[str, ...]:
    """Docker daemon and images, compose and its service, or cargo: before any build.

    Returns the compose command (``docker compose`` or ``docker-compose``) in compose mode.
    """
    controller = cluster.controller
    docker = controller.docker
    if docker is None:
        check_cargo()
        return ()
    if isinstance(docker, DockerSettings):
        check_docker(
            [job.spec.image for job in jobs if job.spec.image],
            f"controller.docker.image is {docker.image!r}",
        )
        return ()
    compose_argv = find_compose()
    ids = (os.geteuid(), os.getegid())
    environments = [compose_environment(controller.path, j.spec.arch, ids) for j in jobs]
    check_docker(
        compose_images(compose_argv, docker, controller.path, environments),
        f"the images of compose service {docker.service!r}",
    )
    if environments:
        create_compose_networks(compose_argv, docker, controller.path, environments[0])
    return compose_argv


def summary_lines(results: Sequence[JobResult], cluster: Cluster) -> list[str]:
    """The final table: host, arch, build (shared or own), result, seconds, log."""
    rows = [("host", "arch", "build", "result", "seconds", "log")]
    for result in results:
        job = result.job
        build = f"shared by {len(job.hosts)}" if len(job.hosts) > 1 else "own"
        state = "ok" if result.ok else "FAILED"
        log = f"{cluster.controller.path.rstrip('/')}/{job.log_file}"
        rows += [
            (host, job.spec.arch, build, state, f"{result.seconds:.1f}", log) for host in job.hosts
        ]
    return format_table(rows)


def _build_tool(cluster: Cluster, compose_argv: Sequence[str]) -> str:
    if cluster.controller.docker is None:
        return "native cargo"
    return f"{' '.join(compose_argv)} run" if compose_argv else "docker run"


def run_builds(
    c: Context,
    cluster: Cluster,
    settings: Settings,
    jobs: Sequence[BuildJob],
    say: Say,
    compose_argv: tuple[str, ...] | None = None,
) -> list[JobResult]:
    """Every build to its end, or every command printed under ``inv --dry``.

    ``compose_argv`` is :func:`check_tools`' answer when the caller already checked.
    """
    run_id = secrets.token_hex(4)
    if c.config.run.dry:
        compose = isinstance(cluster.controller.docker, ComposeService)
        compose_argv = find_compose() if compose else ()
    elif compose_argv is None:
        compose_argv = check_tools(cluster, jobs)
    with StatusBoard() as board:
        builder = Builder(
            c, cluster, run_id, settings.build_timeout, settings.jobs, board, compose_argv
        )
        if c.config.run.dry:
            for job in jobs:
                say(f"[{job.name}] {builder.command(job)}")
            return []
        say(
            f"prebuild: {len(jobs)} build(s) with {_build_tool(cluster, compose_argv)}, "
            f"{min(settings.jobs, len(jobs))} at a time "
            f"(run {run_id}: containers labelled {RUN_LABEL}={run_id})"
        )
        try:
            results = builder.run_all(jobs)
        except KeyboardInterrupt:
            raise FdlError(
                "interrupted: every build of this run was stopped; no envelope was published"
            ) from None
    for line in summary_lines(results, cluster):
        say(line)
    failures = [r for r in results if not r.ok]
    if failures:
        raise FdlError(
            f"{len(failures)} of {len(results)} build(s) failed; no envelope was "
            "published.\n" + "\n".join(failure_report(r, cluster) for r in failures)
        )
    return results


def envelope_path(cluster: Cluster, settings: Settings) -> Path:
    return Path(cluster.controller.path, settings.envelope_file)


def prebuild(
    c: Context, cluster: Cluster, label: str, settings: Settings, command: str, crate: str, say: Say
) -> str | None:
    """The whole pipeline; returns the published envelope text (``None`` under --dry)."""
    remotes = remote_workers(cluster, label)
    jobs = plan_builds(remotes, cluster.controller.docker, command, crate, settings.shared_builds)
    if c.config.run.dry:
        for line in dry_run_lines(cluster, label, abi=True):
            say(line)
        run_builds(c, cluster, settings, jobs, say)
        return None
    lock = Path(cluster.controller.path, CLUSTER_TARGET, "_prebuild.lock")
    with Fleet(remotes, settings, say) as fleet, ThreadPoolExecutor(1) as side:
        tools = side.submit(check_tools, cluster, jobs)  # local checks overlap the ssh probe
        report_preflight(run_preflight(cluster, label, settings, fleet, True, say), False, say)
        compose_argv = tools.result()
        with project_lock(lock, say):
            # Withdraw the previous envelope first: if this run fails, nothing
            # may point a launcher at binaries that are now stale.
            envelope_path(cluster, settings).unlink(missing_ok=True)
            os.environ.pop(ENV_PREBUILD_PER_HOST, None)
            run_builds(c, cluster, settings, jobs, say, compose_argv)
            envelopes = {w.host: PerHostEnvelope.for_worker(w, command, crate) for w in remotes}
            if settings.verify:
                root = Path(cluster.controller.path)
                built = {host: root / job.built_binary for job in jobs for host in job.hosts}
                verify(fleet, envelopes, built, settings, say)
            return publish(envelopes, envelope_path(cluster, settings), say)


def verify(
    fleet: Fleet,
    envelopes: dict[str, PerHostEnvelope],
    built: dict[str, Path],
    settings: Settings,
    say: Say,
) -> None:
    problems = verify_delivery(fleet, envelopes, built, settings, say)
    if problems:
        raise FdlError(
            "delivery verification failed; no envelope was published.\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    say(f"verify: {len(envelopes)} host(s) see the same bytes, every library resolves")


def publish(envelopes: dict[str, PerHostEnvelope], path: Path, say: Say) -> str:
    """Own process environment (for composed tasks and launchers), then the file."""
    text = encode(envelopes)
    write_atomically(path, text + "\n")
    os.environ[ENV_PREBUILD_PER_HOST] = text
    say(
        f"prebuild: envelope for {len(envelopes)} host(s) written to {path} and "
        f"${ENV_PREBUILD_PER_HOST}"
    )
    return text


def build_one(
    c: Context,
    cluster: Cluster,
    settings: Settings,
    worker: Worker,
    command: str,
    crate: str,
    say: Say,
) -> PerHostEnvelope:
    """``build-host``: one host's build, its envelope entry on success."""
    jobs = plan_builds([worker], cluster.controller.docker, command, crate, shared=False)
    run_builds(c, cluster, settings, jobs, say)
    return PerHostEnvelope.for_worker(worker, command, crate)


def read_envelopes(settings: Settings, cluster: Cluster) -> tuple[str, str]:
    """The envelope text and where it came from: the environment, else prebuild's file."""
    text = os.environ.get(ENV_PREBUILD_PER_HOST)
    if text:
        return text, f"${ENV_PREBUILD_PER_HOST}"
    path = envelope_path(cluster, settings)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise FdlError(
            f"no envelope: neither ${ENV_PREBUILD_PER_HOST} nor {path} exists; run prebuild first"
        ) from None
    except OSError as exc:
        raise FdlError(f"cannot read the envelope {path}: {exc}") from None
