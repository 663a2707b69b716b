"""Exact command lines for one build job: ``docker run``, ``docker compose run``, native cargo.

Pure logic: every value is shell-quoted here, once, and the rest of the code
runs these strings as they are (``inv --dry`` prints them).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence

from fdl_tasks.cache import CONTAINER_SCCACHE, CONTAINER_TARGET, CompileCache, with_stats
from fdl_tasks.model import Arch, ComposeService, Controller, DockerSettings
from fdl_tasks.plan import BuildJob, BuildSpec
from fdl_tasks.rules import arch_cuda, cross_env, join_path, libtorch_dir

#: Labels every build container of a run, so a run can find and stop its own.
RUN_LABEL = "fdl-tasks.run"
#: Names the job a build container belongs to (to stop one timed-out build).
JOB_LABEL = "fdl-tasks.job"
#: Where a container's sccache server listens (the container's own /tmp).
CONTAINER_SERVER = "/tmp/fdl-sccache.sock"


def assignments(variables: Mapping[str, str]) -> str:
    """``NAME=value …`` for a shell, each value quoted on its own (a quoted
    ``'NAME=value'`` word would be run as a command)."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())


def cargo_argv(spec: BuildSpec) -> list[str]:
    """``cargo build --release [--features cuda] [--target T] --bin <cmd>`` (flodl's order)."""
    features = ["--features", ",".join(spec.features)] if spec.features else []
    target = ["--target", spec.cross.target] if spec.cross else []
    return ["cargo", "build", "--release", *features, *target, "--bin", spec.command]


def cross_variables(spec: BuildSpec) -> dict[str, str]:
    """The cross linker (and C/C++ compilers) for a cross build; none otherwise."""
    return cross_env(spec.cross.target, spec.cross.linker) if spec.cross else {}


def container_name(run_id: str, job: BuildJob) -> str:
    return f"fdl-{run_id}-{job.name.replace('/', '-').lstrip('_')}"


def container_cache(
    job: BuildJob, controller: Controller, workspace: str, cache: CompileCache | None
) -> tuple[list[str], str]:
    """``-v``/``-e`` flags for the compile cache, and the target dir the container builds in.

    With the cache every build's target dir is mounted at one container path,
    so that the paths sccache hashes are equal across variants.
    """
    if cache is None:
        return [], join_path(workspace, job.target_dir)
    flags = ["-v", f"{join_path(controller.path, job.target_dir)}:{CONTAINER_TARGET}"]
    for mount in cache.container_mounts():
        flags += ["-v", mount]
    for name, value in cache.container_variables(CONTAINER_SERVER).items():
        flags += ["-e", f"{name}={value}"]
    return flags, CONTAINER_TARGET


def docker_command(
    job: BuildJob,
    controller: Controller,
    docker: DockerSettings,
    run_id: str,
    user: str | None,
    cache: CompileCache | None = None,
) -> str:
    """``docker run --rm … cargo build``: project at the workspace, libtorch read-only."""
    image = job.spec.image
    assert image is not None, "docker_command needs a job planned with docker settings"
    workspace = docker.workspace
    cache_flags, target = container_cache(job, controller, workspace, cache)
    argv = ["docker", "run", "--rm", *_container_identity(run_id, job)]
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
    argv += [*run_args, image, *(build if cache else cargo)]
    return shlex.join(argv)


def _container_identity(run_id: str, job: BuildJob) -> list[str]:
    """A name and the labels by which a run finds (and stops) its own containers."""
    return [
        "--name",
        container_name(run_id, job),
        "--label",
        f"{RUN_LABEL}={run_id}",
        "--label",
        f"{JOB_LABEL}={job.name}",
    ]


#: What flodl passes for its ``dev`` (CPU) service's libtorch mount.
COMPOSE_CPU_LIBTORCH = "./libtorch/precompiled/cpu"


def compose_environment(root: str, arch: Arch, ids: tuple[int, int]) -> dict[str, str]:
    """The variables flodl's compose file reads, exactly as flodl sets them, plus ``UID``/``GID``.

    CUDA variables only when the arch encodes a release (as flodl); ``UID``
    and ``GID`` because bash never exports ``UID`` and the file's
    ``user: "${UID:-1000}:${GID:-1000}"`` should be the invoking user.
    """
    environment = {
        "LIBTORCH_HOST_PATH": libtorch_dir(root, arch),
        "LIBTORCH_CPU_PATH": COMPOSE_CPU_LIBTORCH,
    }
    cuda = arch_cuda(arch)
    if cuda:
        environment |= {"CUDA_VERSION": cuda.version, "CUDA_TAG": cuda.tag}
    return environment | {"UID": str(ids[0]), "GID": str(ids[1])}


def compose_command(
    job: BuildJob,
    controller: Controller,
    compose: ComposeService,
    compose_argv: Sequence[str],
    run_id: str,
    ids: tuple[int, int],
    cache: CompileCache | None = None,
) -> str:
    """flodl's ``docker compose run --rm <service> bash -c 'cd … && CARGO_TARGET_DIR=… cargo …'``.

    Run from the project root with flodl's variables set through env(1) (bash
    treats ``UID=…`` as an assignment to its read-only variable); ``-T``, a
    name, the run's labels and the compile cache's flags are what fdl-tasks adds.
    """
    cache_flags, target = container_cache(job, controller, compose.workspace, cache)
    variables = {"CARGO_TARGET_DIR": target, **cross_variables(job.spec)}
    build = f"{assignments(variables)} {shlex.join(cargo_argv(job.spec))}"
    if cache:
        build = with_stats(build, CONTAINER_SCCACHE, target)
    inner = f"cd {shlex.quote(join_path(compose.workspace, job.spec.crate_dir))} && {build}"
    environment = compose_environment(controller.path, job.spec.arch, ids)
    service = job.spec.cross.service if job.spec.cross else None
    argv = [
        "env",
        *(f"{name}={value}" for name, value in environment.items()),
        *compose_argv,
        "run",
        "--rm",
        "-T",
        *_container_identity(run_id, job),
        *cache_flags,
        service or compose.service,
        "bash",
        "-c",
        inner,
    ]
    return f"cd {shlex.quote(controller.path)} && exec " + shlex.join(argv)


def native_server(run_id: str, job_name: str) -> str:
    """The socket of a native build's own sccache server (short: Unix sockets allow ~107)."""
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:12]
    return f"/tmp/fdl-sccache-{run_id}-{digest}.sock"


def native_command(
    job: BuildJob, controller: Controller, cache: CompileCache | None = None, run_id: str = ""
) -> str:
    """The same cargo build on the controller, in its own session (``exec setsid``).

    Its process id is then its process group, so a timeout or an interrupt
    can stop cargo together with every rustc it started. With the compile
    cache the target dir is passed as ``--target-dir``: sccache hashes every
    ``CARGO_*`` variable, so ``CARGO_TARGET_DIR`` would make every variant miss.
    """
    crate = join_path(controller.path, job.spec.crate_dir)
    target = join_path(controller.path, job.target_dir)
    env = [f"LIBTORCH_PATH={libtorch_dir(controller.path, job.spec.arch)}"]
    env += [f"{k}={v}" for k, v in cross_variables(job.spec).items()]
    if cache is None:
        command = ["env", env[0], f"CARGO_TARGET_DIR={target}", *env[1:], *cargo_argv(job.spec)]
    else:
        server = native_server(run_id, job.name)
        env += [f"{k}={v}" for k, v in cache.native_variables(server).items()]
        build = shlex.join([*cargo_argv(job.spec), "--target-dir", target])
        command = ["env", *env, "sh", "-c", with_stats(build, cache.binary, target)]
    return f"cd {shlex.quote(crate)} && exec " + shlex.join(["setsid", *command])
