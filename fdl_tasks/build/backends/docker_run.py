"""``docker run`` builds: the project at the workspace path, the variant's libtorch read-only.

A stop or a timeout removes the build's containers, found by their labels
(stopping the ``docker`` client would leave the container running).
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping, Sequence

import attrs

from fdl_tasks.build.backends.containers import ContainerBackend
from fdl_tasks.build.build_argv import (
    cargo_argv,
    container_cache,
    container_identity,
    cross_variables,
)
from fdl_tasks.build.build_environment import BuildEnvironment, BuildJob, NoEnvironment
from fdl_tasks.build.build_record import RECORD_RUN_ID, RecordInputs
from fdl_tasks.build.docker_tools import check_docker, user_ids
from fdl_tasks.build.parked_standbys import park_mount
from fdl_tasks.cache.compile_cache import (
    CONTAINER_SCCACHE,
    CONTAINER_TARGET,
    CompileCache,
    with_stats,
)
from fdl_tasks.config.model import Arch, BuildMode, Controller, CrossSetup, DockerSettings
from fdl_tasks.config.names import join_path
from fdl_tasks.config.variants import (
    CUDA_TAG_FIELD,
    CUDA_VERSION_FIELD,
    Cuda,
    arch_cuda,
    libtorch_dir,
)
from fdl_tasks.gpu.gpus import Vendor


def resolve_image(docker: DockerSettings, template: str, arch: Arch) -> str | NoEnvironment:
    """Fill ``{cuda_version}`` (``12.8.0``) and ``{cuda_tag}`` (``12.8``) as flodl names them.

    The arch gives the release, else ``cuda_version``; the loader allows no
    other template field, so plain replacement is enough.
    """
    if CUDA_VERSION_FIELD not in template and CUDA_TAG_FIELD not in template:
        return template
    cuda = arch_cuda(arch) or (Cuda.parse(docker.cuda_version) if docker.cuda_version else None)
    if cuda is None:
        return NoEnvironment(
            f"image {template!r} needs a CUDA version but arch {arch!r} encodes none: "
            "set controller.docker.cuda_version in the cluster file (e.g. '12.8')"
        )
    return template.replace(CUDA_VERSION_FIELD, cuda.version).replace(CUDA_TAG_FIELD, cuda.tag)


def project_mounts(controller: Controller, docker: DockerSettings) -> list[tuple[str, str | None]]:
    """The container's mount table, written once: the project at the workspace, and the
    build's variant (``None``: each job's own) at the libtorch path."""
    return [(docker.workspace, controller.path), (docker.libtorch, None)]


def docker_line(
    job: BuildJob,
    controller: Controller,
    docker: DockerSettings,
    run_id: str,
    user: str | None,
    cache: CompileCache | None = None,
) -> str:
    """``docker run --rm … cargo build``: project at the workspace, libtorch read-only."""
    options = run_options(job, controller, docker, user, cache)
    command = build_command(job, cache)
    return shlex.join(
        ["docker", "run", "--rm", *container_identity(run_id, job), *options, *command]
    )


def run_options(
    job: BuildJob,
    controller: Controller,
    docker: DockerSettings,
    user: str | None,
    cache: CompileCache | None,
) -> list[str]:
    """Every ``docker run`` option of a build, the image last: its user, mounts, working
    directory, variables, the compile cache's, the user's ``run_args``."""
    workspace = docker.workspace
    cache_flags, target = container_cache(job, controller, workspace, cache)
    argv = ["--user", user] if user else []
    for inside, outside in project_mounts(controller, docker):
        variant = outside is None  # the job's own variant, read-only
        source = libtorch_dir(controller.path, job.build.arch) if variant else outside
        argv += ["-v", f"{source}:{inside}:ro" if variant else f"{source}:{inside}"]
    argv += [
        "-w",
        join_path(workspace, job.build.crate_dir),
        "-e",
        f"CARGO_TARGET_DIR={target}",
        "-e",
        f"LIBTORCH_PATH={docker.libtorch}",
        *cache_flags,
    ]
    cross = job.build.cross
    env = dict(cross.env) if cross and cross.env is not None else docker.env
    run_args = job_run_args(job, docker)
    for name, value in {**env, **cross_variables(job.build)}.items():
        argv += ["-e", f"{name}={value}"]
    network = cache.container_run_args(run_args) if cache else []
    return [*argv, *run_args, *network, job.build.environment.toolchain]


def build_command(job: BuildJob, cache: CompileCache | None) -> list[str]:
    """What runs in the container: cargo, or with the cache a shell that asks sccache for
    the build's counts after it."""
    cargo = cargo_argv(job.build)
    if cache is None:
        return cargo
    return ["sh", "-c", with_stats(shlex.join(cargo), CONTAINER_SCCACHE, CONTAINER_TARGET)]


def job_run_args(job: BuildJob, docker: DockerSettings) -> tuple[str, ...]:
    """The user's ``docker run`` arguments for this job: its cross setup's, else docker's."""
    cross = job.build.cross
    return tuple(cross.run_args if cross and cross.run_args is not None else docker.run_args)


#: ``docker run`` options whose inputs a record cannot see (another container's volumes, an
#: environment file): a build given one always runs cargo.
UNSEEN_INPUTS = ("--mount", "--volumes-from", "--env-file")
_VALUED = {"-v": "-v", "--volume": "-v", "-e": "-e", "--env": "-e"}


@attrs.frozen
class UserInputs:
    """What the user's ``run_args`` add: bind mounts (container path, controller path)
    and variables set with a value."""

    mounts: tuple[tuple[str, str], ...]
    env: Mapping[str, str]


def user_inputs(run_args: Sequence[str]) -> UserInputs | None:
    """The bind mounts and variables of ``run_args``; ``None`` when they give a build an
    input no record can see: a named volume, an option of :data:`UNSEEN_INPUTS`, a
    variable taken from the client's environment (``-e NAME``), or short options run
    together (``-tv``) that this reading does not take apart."""
    mounts, env, args = [], {}, list(run_args)
    while args:
        arg = args.pop(0)
        name, equals, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in UNSEEN_INPUTS:
            return None
        cluster = arg[:1] == "-" and arg[1:2] not in ("-", "v", "e") and len(arg) > 2
        if cluster and set(arg[2:]) & {"v", "e"}:  # -tv/a:/b is -t -v /a:/b to Docker
            return None
        short = _VALUED.get(name) or (arg[:2] if arg[:2] in ("-v", "-e") else None)
        if short is None:
            continue
        if not equals and name in _VALUED:
            value = args.pop(0) if args else ""
        elif not equals:
            value = arg[2:]
        if short == "-e":
            variable, assigned, setting = value.partition("=")
            if not assigned:
                return None
            env[variable] = setting
            continue
        source, _, rest = value.partition(":")
        if not source.startswith("/") or not rest:
            return None
        mounts.append((rest.partition(":")[0], source))
    return UserInputs(tuple(mounts), env)


def container_user() -> str | None:
    """Run as the invoking user so files on the shared mount are not owned by root."""
    uid, gid = user_ids()
    return None if uid == 0 else f"{uid}:{gid}"


class DockerRunBackend(ContainerBackend):
    """``docker run --rm`` of ``controller.docker.image`` (or a cross setup's, or a vendor's)."""

    tool = "docker run"
    mode: BuildMode = "docker"
    toolchain_key = "image"

    @property
    def docker(self) -> DockerSettings:
        assert isinstance(self.controller.docker, DockerSettings), "the registry chose by type"
        return self.controller.docker

    @functools.cached_property
    def user(self) -> str | None:
        return container_user()

    @functools.cached_property
    def image_ids(self) -> dict[str, str]:
        """Each image's content id, as :meth:`check` found it."""
        return {}

    def toolchain(
        self, arch: Arch, vendor: Vendor, cross: CrossSetup | None
    ) -> str | NoEnvironment:
        """The cross setup's image, else the vendor's (``controller.gpu_builds``), else
        ``controller.docker.image``; its CUDA fields filled from the arch."""
        build = self.controller.gpu_builds.get(vendor) if vendor != "cpu" else None
        chosen = (cross.image if cross else None) or (build.image if build else None)
        return resolve_image(self.docker, chosen or self.docker.image, arch)

    def mounts(self) -> list[tuple[str, str | None]]:
        return project_mounts(self.controller, self.docker)

    def check(self, environments: Sequence[BuildEnvironment]) -> None:
        self.image_ids |= check_docker(
            [environment.toolchain for environment in environments],
            f"controller.docker.image is {self.docker.image!r}",
            self.source,
        )

    def record_inputs(self, job: BuildJob) -> RecordInputs:
        """The image's id and the build line with the run's own names fixed, the mounts
        (a mounted ``RUSTUP_HOME`` apart: too big to walk); no identity for a
        ``--timings`` build (its report comes from cargo) or one given inputs no record
        can see (then only the mounts it can name)."""
        image_id = self.image_ids.get(job.build.environment.toolchain)
        user = user_inputs(job_run_args(job, self.docker))
        if image_id is None or job.build.timings or user is None:
            return RecordInputs(None, tuple(self.mounts()) + (user.mounts if user else ()))
        cross = job.build.cross
        env = {**(dict(cross.env) if cross and cross.env is not None else self.docker.env)}
        rustup = env.get("RUSTUP_HOME") or user.env.get("RUSTUP_HOME")
        homes = tuple(source for inside, source in user.mounts if inside == rustup)
        line = docker_line(job, self.controller, self.docker, RECORD_RUN_ID, self.user, self.cache)
        return RecordInputs(
            f"{image_id} {line}",
            tuple([*self.mounts(), *user.mounts]),
            tuple(source for _, source in user.mounts if source not in homes),
            homes,
        )

    def stand_by(self, job: BuildJob) -> None:
        if self.warm is not None:
            image = job.build.environment.toolchain
            self.warm.stand_by(self.image_ids.get(image), self._options(job))

    def build_line(self, job: BuildJob) -> str:
        """A ``docker exec`` in the job's warm container (found or made here), else the
        ``docker run`` of a container of its own."""
        if self.warm is not None:
            image = job.build.environment.toolchain
            options = self._options(job)
            name = self.warm.container_for(job.name, image, self.image_ids.get(image), options)
            if name is not None:
                return self.warm.exec_line(name, build_command(job, self.cache))
        return docker_line(job, self.controller, self.docker, self.run_id, self.user, self.cache)

    def _options(self, job: BuildJob) -> list[str]:
        """A warm container's options: a build's own, and the project's parked standbys."""
        options = run_options(job, self.controller, self.docker, self.user, self.cache)
        mount = park_mount(self.warm.root) if self.warm else None
        return [*options[:-1], mount, options[-1]] if mount else options
