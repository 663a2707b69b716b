"""docker compose builds, exactly as flodl runs them: ``compose run --rm <service> bash -c …``.

The project's compose file decides the image, the user and the mounts;
flodl's variables select the variant. A stop or a timeout removes the
build's containers, found by their labels.
"""

from __future__ import annotations

import functools
import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from fdl_tasks.build.backends.containers import ContainerBackend
from fdl_tasks.build.build_argv import (
    assignments,
    cargo_argv,
    container_cache,
    container_identity,
    cross_variables,
)
from fdl_tasks.build.build_environment import BuildEnvironment, BuildJob, NoEnvironment
from fdl_tasks.build.build_record import RECORD_RUN_ID, RecordInputs
from fdl_tasks.build.docker_tools import (
    check_docker,
    compose_configs,
    create_compose_networks,
    find_compose,
    service_images,
    user_ids,
)
from fdl_tasks.build.warm_containers import Start
from fdl_tasks.cache.compile_cache import CONTAINER_SCCACHE, CompileCache, with_stats
from fdl_tasks.config.model import Arch, BuildMode, ComposeService, Controller, CrossSetup
from fdl_tasks.config.names import join_path
from fdl_tasks.config.variants import arch_cuda, libtorch_dir
from fdl_tasks.gpu.gpus import Vendor

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
    if cuda := arch_cuda(arch):
        environment |= {"CUDA_VERSION": cuda.version, "CUDA_TAG": cuda.tag}
    return environment | {"UID": str(ids[0]), "GID": str(ids[1])}


#: Variables a service passes through that are the tool's output, not a build's input.
NOT_INPUTS = ("FLODL_INTERNAL_PREBUILD_PER_HOST",)


def _bind(volume: object) -> tuple[str, str] | None:
    """(container path, host path) of a bind mount as ``docker compose config`` prints it
    (v2's long form, v1's ``source:target[:mode]``); ``None`` for anything else."""
    if isinstance(volume, Mapping):
        source, target = volume.get("source"), volume.get("target")
        bound = volume.get("type") == "bind"
    else:
        source, _, rest = str(volume).partition(":")
        target, bound = rest.partition(":")[0], bool(rest)
    if not bound or not isinstance(source, str) or not source.startswith("/"):
        return None
    return str(target), posixpath.normpath(source)


def service_inputs(
    service: Mapping[str, Any], image_id: str | None, root: str, variant: str, line: str
) -> RecordInputs | None:
    """What a build in this resolved service reads: the image's content id, the service as
    compose resolved it and the build line make its identity; its bind mounts are looked
    at (the project and the variant as such, a mounted ``RUSTUP_HOME`` by what an update
    rewrites). ``None`` when it reads what no record can see (a named volume, no image)."""
    binds = [_bind(v) for v in service.get("volumes") or ()]
    if image_id is None or None in binds:
        return None
    mounts = [b for b in binds if b is not None]
    environment = service.get("environment") or {}
    if not isinstance(environment, Mapping):
        return None
    rustup = environment.get("RUSTUP_HOME")
    homes = tuple(source for target, source in mounts if target == rustup)
    own = {posixpath.normpath(root), posixpath.normpath(variant), *homes}
    seen = {k: v for k, v in service.items() if k != "environment"}
    seen["environment"] = {k: v for k, v in environment.items() if k not in NOT_INPUTS}
    return RecordInputs(
        f"{image_id} {json.dumps(seen, sort_keys=True, default=str)} {line}",
        tuple((t, None if s == posixpath.normpath(variant) else s) for t, s in mounts),
        tuple(s for _, s in mounts if s not in own),
        homes,
    )


def compose_line(
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
    start = compose_start(job, controller, compose_argv, ids, cache)
    return start(container_identity(run_id, job), compose_command(job, controller, compose, cache))


def compose_command(
    job: BuildJob, controller: Controller, compose: ComposeService, cache: CompileCache | None
) -> list[str]:
    """What runs in the service's container: ``bash -c 'cd <crate> && VARS cargo …'``."""
    target = container_cache(job, controller, compose.workspace, cache)[1]
    variables = {"CARGO_TARGET_DIR": target, **cross_variables(job.build)}
    build = f"{assignments(variables)} {shlex.join(cargo_argv(job.build))}"
    if cache:
        build = with_stats(build, CONTAINER_SCCACHE, target)
    inner = f"cd {shlex.quote(join_path(compose.workspace, job.build.crate_dir))} && {build}"
    return ["bash", "-c", inner]


def compose_start(
    job: BuildJob,
    controller: Controller,
    compose_argv: Sequence[str],
    ids: tuple[int, int],
    cache: CompileCache | None,
    detached: bool = False,
) -> Start:
    """The ``compose run`` line of the job's service, from a container's name and labels
    and its command (``detached``: ``-d``, for a warm container)."""
    cache_flags = container_cache(job, controller, "", cache)[0]
    environment = compose_environment(controller.path, job.build.arch, ids)
    head = ["env", *(f"{name}={value}" for name, value in environment.items()), *compose_argv]

    def line(identity: Sequence[str], command: Sequence[str]) -> str:
        run = ["run", *(["-d"] if detached else []), "--rm", "-T", *identity, *cache_flags]
        argv = [*head, *run, job.build.environment.toolchain, *command]
        return f"cd {shlex.quote(controller.path)} && exec " + shlex.join(argv)

    return line


class ComposeBackend(ContainerBackend):
    """``docker compose run`` of ``controller.docker``'s service (or a cross setup's, or a
    vendor's)."""

    mode: BuildMode = "compose"
    toolchain_key = "service"

    @functools.cached_property
    def compose_argv(self) -> tuple[str, ...]:
        """``docker compose`` or ``docker-compose``, looked for when first needed."""
        return find_compose()

    @functools.cached_property
    def ids(self) -> tuple[int, int]:
        return user_ids()

    @property
    def compose(self) -> ComposeService:
        assert isinstance(self.controller.docker, ComposeService), "the registry chose by type"
        return self.controller.docker

    @functools.cached_property
    def resolved(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Any, str | None]]:
        """(service, its variables) → the service as compose resolved it, and its image's id."""
        return {}

    @property
    def tool(self) -> str:
        return f"{' '.join(self.compose_argv)} run"

    def toolchain(
        self, arch: Arch, vendor: Vendor, cross: CrossSetup | None
    ) -> str | NoEnvironment:
        """A cross setup's service (else the main one); else the vendor's
        (``controller.gpu_builds``), else ``controller.docker``'s."""
        if cross:
            return cross.service or self.compose.service
        build = self.controller.gpu_builds.get(vendor) if vendor != "cpu" else None
        return (build.service if build else None) or self.compose.service

    def mounts(self) -> list[tuple[str, str | None]]:
        return [(self.compose.workspace, self.controller.path)]  # the compose file mounts the rest

    def record_inputs(self, job: BuildJob) -> RecordInputs:
        """The service as this run's check resolved it (:func:`service_inputs`); no
        identity for a ``--timings`` build, a service not checked in this run or one that
        reads what no record sees: what it reads of the project is still recorded."""
        root, build = self.controller.path, job.build
        variables = compose_environment(root, build.arch, self.ids)
        found = self.resolved.get((build.environment.toolchain, tuple(sorted(variables.items()))))
        if found is None or build.timings:
            return RecordInputs(None, tuple(self.mounts()))
        service, image_id = found
        line = self.cold_line(job, RECORD_RUN_ID)
        inputs = service_inputs(service, image_id, root, libtorch_dir(root, build.arch), line)
        return inputs or RecordInputs(None, tuple(self.mounts()))

    def check(self, environments: Sequence[BuildEnvironment]) -> None:
        """Each service resolves to local images under each build's variables, and the
        project's networks exist before builds start in parallel."""
        root = self.controller.path
        services: dict[str, list[dict[str, str]]] = {}
        for build in environments:
            variables = compose_environment(root, build.arch, self.ids)
            services.setdefault(build.toolchain, []).append(variables)
        for service, sets in services.items():
            configs = compose_configs(self.compose_argv, service, root, sets, self.source)
            images = service_images(configs, service)
            ids = check_docker(images, f"the images of compose service {service!r}", self.source)
            distinct = dict.fromkeys(tuple(sorted(v.items())) for v in sets)
            for key, config in zip(distinct, configs, strict=True):
                resolved = config["services"][service]
                self.resolved[(service, key)] = (resolved, ids.get(str(resolved.get("image"))))
            create_compose_networks(self.compose_argv, service, root, sets[0], configs[0])

    def build_line(self, job: BuildJob) -> str:
        """A ``docker exec`` in the job's warm container (a ``compose run -d`` of its service,
        found or made here), else a ``compose run --rm`` of its own."""
        if self.warm is not None and (name := self.warm_container(job)):
            return self.warm.exec_line(
                name, compose_command(job, self.controller, self.compose, self.cache)
            )
        return self.cold_line(job, self.run_id)

    def stand_by(self, job: BuildJob) -> None:
        if self.warm is not None:
            self.warm.stand_by(*self._warm_spec(job))

    def warm_container(self, job: BuildJob) -> str | None:
        """The job's warm container: it stands for the service as compose resolved it under
        the job's variables, the image's id, the compile cache's flags and what the
        service's bind mounts are; none for a service this run did not check, or one with
        an entrypoint (a ``docker exec`` would skip it)."""
        assert self.warm is not None
        image_id, options = self._warm_spec(job)
        start = compose_start(job, self.controller, self.compose_argv, self.ids, self.cache, True)
        return self.warm.container_for(
            job.name, job.build.environment.toolchain, image_id, options, start
        )

    def _warm_spec(self, job: BuildJob) -> tuple[str | None, list[str]]:
        """The service's image id and what stands for its container's options."""
        build, controller = job.build, self.controller
        variables = compose_environment(controller.path, build.arch, self.ids)
        found = self.resolved.get((build.environment.toolchain, tuple(sorted(variables.items()))))
        service, image_id = found if found else ({}, None)
        binds = [b for b in (_bind(v) for v in service.get("volumes") or ()) if b]
        entrypoint = service.get("entrypoint")
        options = [
            json.dumps(service, sort_keys=True, default=str),
            *([f"--entrypoint={entrypoint}"] if entrypoint else []),
            *(f"--volume={source}:{target}" for target, source in binds),
            *container_cache(job, controller, "", self.cache)[0],
            *(f"{name}={value}" for name, value in variables.items()),
        ]
        return image_id, options

    def cold_line(self, job: BuildJob, run_id: str) -> str:
        """The ``compose run --rm`` line (``run_id``: the run's, or a record's
        :data:`RECORD_RUN_ID`)."""
        return compose_line(
            job, self.controller, self.compose, self.compose_argv, run_id, self.ids, self.cache
        )
