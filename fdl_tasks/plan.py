"""Build plans: which builds to run for which hosts, and the exact command lines.

Pure logic. A :class:`BuildJob` is one cargo invocation; with shared builds,
hosts whose builds would be identical share a job, and each still gets its
binary at its own ``target/cluster/<host>/<arch-slug>/release/<cmd>``.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable

import attrs

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Arch, Controller, DockerSettings, Worker
from fdl_tasks.rules import (
    CLUSTER_TARGET,
    CUDA_TAG_FIELD,
    CUDA_VERSION_FIELD,
    PROFILE_DIR,
    arch_slug,
    binary_path,
    cargo_features,
    cuda_version,
    join_path,
    libtorch_dir,
    require_arch,
    target_dir,
)

#: Labels every build container of a run, so a run can find and stop its own.
RUN_LABEL = "fdl-tasks.run"
#: Names the job a build container belongs to (to stop one timed-out build).
JOB_LABEL = "fdl-tasks.job"
#: Shared build trees live here; host labels cannot start with ``_``.
SHARED_DIR = f"{CLUSTER_TARGET}/_shared"


@attrs.frozen
class BuildSpec:
    """Everything that makes two builds produce the same binary."""

    arch: Arch
    features: tuple[str, ...]
    image: str | None
    crate_dir: str
    command: str


@attrs.frozen
class BuildJob:
    """One cargo build, serving one host or several identical ones."""

    name: str
    spec: BuildSpec
    hosts: tuple[str, ...]
    target_dir: str

    @property
    def built_binary(self) -> str:
        """Where cargo leaves the binary, relative to the project root."""
        return f"{self.target_dir}/{PROFILE_DIR}/{self.spec.command}"

    def host_binary(self, host: str) -> str:
        return binary_path(host, self.spec.arch, self.spec.command)

    @property
    def log_file(self) -> str:
        return f"{self.target_dir}/build.log"


def resolve_image(docker: DockerSettings, arch: Arch) -> str:
    """Fill ``{cuda_version}``/``{cuda_tag}`` from the arch, else the configured default.

    The loader allows no other template field, so plain replacement is enough.
    """
    if CUDA_VERSION_FIELD not in docker.image and CUDA_TAG_FIELD not in docker.image:
        return docker.image
    version = cuda_version(arch) or docker.cuda_version
    if version is None:
        raise FdlError(
            f"image {docker.image!r} needs a CUDA version but arch {arch!r} encodes none: "
            "set controller.docker.cuda_version in cluster.yaml (e.g. '12.8')"
        )
    return docker.image.replace(CUDA_VERSION_FIELD, version).replace(CUDA_TAG_FIELD, version)


def build_spec(
    worker: Worker, docker: DockerSettings | None, command: str, crate_dir: str
) -> BuildSpec:
    arch = require_arch(worker)
    image = resolve_image(docker, arch) if docker else None
    return BuildSpec(arch, cargo_features(arch), image, crate_dir, command)


def _shared_name(spec: BuildSpec) -> str:
    digest = hashlib.sha256(repr(attrs.astuple(spec)).encode()).hexdigest()[:10]
    return f"_shared/{arch_slug(spec.arch)}-{digest}"


def plan_builds(
    workers: Iterable[Worker],
    docker: DockerSettings | None,
    command: str,
    crate_dir: str,
    shared: bool,
) -> list[BuildJob]:
    """One job per distinct build when ``shared``, else one per host."""
    specs = {w.host: build_spec(w, docker, command, crate_dir) for w in workers}
    if not shared:
        return [
            BuildJob(host, spec, (host,), target_dir(host, spec.arch))
            for host, spec in specs.items()
        ]
    groups: dict[BuildSpec, list[str]] = {}
    for host, spec in specs.items():
        groups.setdefault(spec, []).append(host)
    return [
        BuildJob(_shared_name(spec), spec, tuple(hosts), f"{CLUSTER_TARGET}/{_shared_name(spec)}")
        for spec, hosts in groups.items()
    ]


def cargo_argv(spec: BuildSpec) -> list[str]:
    argv = ["cargo", "build", "--release", "--bin", spec.command]
    if spec.features:
        argv += ["--features", ",".join(spec.features)]
    return argv


def container_name(run_id: str, job: BuildJob) -> str:
    return f"fdl-{run_id}-{job.name.replace('/', '-').lstrip('_')}"


def docker_command(
    job: BuildJob,
    controller: Controller,
    docker: DockerSettings,
    run_id: str,
    user: str | None,
) -> str:
    """``docker run --rm … cargo build``: project at the workspace, libtorch read-only."""
    image = job.spec.image
    assert image is not None, "docker_command needs a job planned with docker settings"
    workspace = docker.workspace
    argv = [
        "docker",
        "run",
        "--rm",
        "--name",
        container_name(run_id, job),
        "--label",
        f"{RUN_LABEL}={run_id}",
        "--label",
        f"{JOB_LABEL}={job.name}",
    ]
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
        f"CARGO_TARGET_DIR={join_path(workspace, job.target_dir)}",
        "-e",
        f"LIBTORCH_PATH={docker.libtorch}",
    ]
    for name, value in docker.env.items():
        argv += ["-e", f"{name}={value}"]
    argv += [*docker.run_args, image, *cargo_argv(job.spec)]
    return shlex.join(argv)


def native_command(job: BuildJob, controller: Controller) -> str:
    """The same cargo build on the controller, in its own session (``exec setsid``).

    Its process id is then its process group, so a timeout or an interrupt
    can stop cargo together with every rustc it started.
    """
    crate = join_path(controller.path, job.spec.crate_dir)
    env = [
        f"LIBTORCH_PATH={libtorch_dir(controller.path, job.spec.arch)}",
        f"CARGO_TARGET_DIR={join_path(controller.path, job.target_dir)}",
    ]
    return f"cd {shlex.quote(crate)} && exec " + shlex.join(
        ["setsid", "env", *env, *cargo_argv(job.spec)]
    )
