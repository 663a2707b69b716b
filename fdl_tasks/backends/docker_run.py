"""``docker run`` builds: the project at the workspace path, the variant's libtorch read-only.

A stop or a timeout removes the build's containers, found by their labels
(stopping the ``docker`` client would leave the container running).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from fdl_tasks.backends.containers import ContainerBackend
from fdl_tasks.build_argv import cargo_argv, container_cache, container_identity, cross_variables
from fdl_tasks.build_plan import BuildJob
from fdl_tasks.cache import CONTAINER_SCCACHE, CompileCache, with_stats
from fdl_tasks.docker_tools import check_docker, user_ids
from fdl_tasks.model import Controller, DockerSettings
from fdl_tasks.names import join_path
from fdl_tasks.variants import libtorch_dir


def docker_line(
    job: BuildJob,
    controller: Controller,
    docker: DockerSettings,
    run_id: str,
    user: str | None,
    cache: CompileCache | None = None,
) -> str:
    """``docker run --rm … cargo build``: project at the workspace, libtorch read-only."""
    image = job.spec.image
    assert image is not None, "docker_line needs a job planned with docker settings"
    workspace = docker.workspace
    cache_flags, target = container_cache(job, controller, workspace, cache)
    argv = ["docker", "run", "--rm", *container_identity(run_id, job)]
    if user:
        argv += ["--user", user]
    argv += [
        "-v",
        f"{controller.path}:{workspace}",
        "-v",
        f"{libtorch_dir(controller.path, job.spec.arch)}:{docker.libtorch}:ro",
        "-w",
        join_path(workspace, job.spec.crate_dir),
        "-e",
        f"CARGO_TARGET_DIR={target}",
        "-e",
        f"LIBTORCH_PATH={docker.libtorch}",
        *cache_flags,
    ]
    cross = job.spec.cross
    env = dict(cross.env) if cross and cross.env is not None else docker.env
    run_args = cross.run_args if cross and cross.run_args is not None else docker.run_args
    for name, value in {**env, **cross_variables(job.spec)}.items():
        argv += ["-e", f"{name}={value}"]
    cargo = cargo_argv(job.spec)
    build = ["sh", "-c", with_stats(shlex.join(cargo), CONTAINER_SCCACHE, target)]
    network = cache.container_run_args(run_args) if cache else []
    argv += [*run_args, *network, image, *(build if cache else cargo)]
    return shlex.join(argv)


def container_user() -> str | None:
    """Run as the invoking user so files on the shared mount are not owned by root."""
    uid, gid = user_ids()
    return None if uid == 0 else f"{uid}:{gid}"


class DockerRunBackend(ContainerBackend):
    """``docker run --rm`` of ``controller.docker.image`` (or a cross setup's image)."""

    tool = "docker run"

    def __init__(self, controller: Controller, docker: DockerSettings, source: str) -> None:
        self.controller, self.docker, self.user = controller, docker, container_user()
        self.source = source

    def check(self, jobs: Sequence[BuildJob]) -> None:
        check_docker(
            [job.spec.image for job in jobs if job.spec.image],
            f"controller.docker.image is {self.docker.image!r}",
            self.source,
        )

    def build_line(self, job: BuildJob, run_id: str, cache: CompileCache | None) -> str:
        return docker_line(job, self.controller, self.docker, run_id, self.user, cache)
