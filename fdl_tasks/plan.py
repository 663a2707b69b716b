"""Build plans: which builds to run for which hosts, in which target dirs.

Pure logic. A :class:`BuildJob` is one cargo invocation; with shared builds,
hosts of one build environment share a job, and each still gets its
binary at its own ``target/cluster/<host>/<arch-slug>/release/<cmd>``
(:mod:`fdl_tasks.layout` names every path).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from fdl_tasks.errors import FdlError
from fdl_tasks.layout import BuildKey, built_binary, host_binary, host_dir, log_file, shared_dir
from fdl_tasks.model import (
    Arch,
    BuildMode,
    ComposeService,
    Controller,
    CrossSetup,
    DockerSettings,
    Worker,
)
from fdl_tasks.rules import (
    CUDA_TAG_FIELD,
    CUDA_VERSION_FIELD,
    GNU_TARGETS,
    Cuda,
    arch_cuda,
    cargo_features,
    require_arch,
)
from fdl_tasks.vendor_builds import check_vendor_builds, vendor_environment


@attrs.frozen
class CrossBuild:
    """A build for hosts of another CPU architecture than the controller's."""

    cpu_arch: str
    target: str
    linker: str
    service: str | None = None  # compose mode: the service that cross-builds
    run_args: tuple[str, ...] | None = None  # docker run mode: instead of docker's
    env: tuple[tuple[str, str], ...] | None = None  # docker run mode: instead of docker's


@attrs.frozen
class BuildSpec:
    """Everything that makes two builds produce the same binary."""

    arch: Arch
    features: tuple[str, ...]
    image: str | None
    crate_dir: str
    command: str
    cross: CrossBuild | None = None
    mode: BuildMode = "docker"
    service: str | None = None  # compose mode: the service that builds
    #: cargo ``--timings`` (its own report in the target dir); changes no output.
    timings: bool = False

    @property
    def cpu_arch(self) -> str | None:
        """The CPU architecture built for, when it is not the controller's."""
        return self.cross.cpu_arch if self.cross else None

    @property
    def key(self) -> BuildKey:
        """What the target dir depends on: everything here but the command and the crate."""
        cross = self.cross
        return BuildKey(
            mode=self.mode,
            arch=self.arch,
            features=self.features,
            environment=self.image or self.service or "",
            cpu_arch=cross.cpu_arch if cross else None,
            rust_target=cross.target if cross else None,
            linker=cross.linker if cross else None,
        )


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
        cross = self.spec.cross
        return built_binary(self.target_dir, self.spec.command, cross.target if cross else None)

    def host_binary(self, host: str) -> str:
        return host_binary(host, self.spec.arch, self.spec.command, self.spec.cpu_arch)

    @property
    def log_file(self) -> str:
        return log_file(self.target_dir, self.spec.command)


def resolve_image(docker: DockerSettings, arch: Arch) -> str:
    """Fill ``{cuda_version}`` (``12.8.0``) and ``{cuda_tag}`` (``12.8``) as flodl names them.

    The arch gives the release, else ``cuda_version``; the loader allows no
    other template field, so plain replacement is enough.
    """
    if CUDA_VERSION_FIELD not in docker.image and CUDA_TAG_FIELD not in docker.image:
        return docker.image
    cuda = arch_cuda(arch) or (Cuda.parse(docker.cuda_version) if docker.cuda_version else None)
    if cuda is None:
        raise FdlError(
            f"image {docker.image!r} needs a CUDA version but arch {arch!r} encodes none: "
            "set controller.docker.cuda_version in cluster.yaml (e.g. '12.8')"
        )
    return docker.image.replace(CUDA_VERSION_FIELD, cuda.version).replace(CUDA_TAG_FIELD, cuda.tag)


def cross_build(
    cpu_arch: str, setup: CrossSetup, docker: DockerSettings | ComposeService | None
) -> CrossBuild:
    """The cross build for ``cpu_arch``: the setup's values, else the GNU defaults."""
    target, linker = GNU_TARGETS.get(cpu_arch, ("", ""))
    service = (setup.service or docker.service) if isinstance(docker, ComposeService) else None
    env = tuple(setup.env.items()) if setup.env is not None else None
    return CrossBuild(
        cpu_arch, setup.target or target, setup.linker or linker, service, setup.run_args, env
    )


def build_spec(
    worker: Worker,
    controller: Controller,
    command: str,
    crate_dir: str,
    cross_setup: tuple[str, CrossSetup] | None = None,
) -> BuildSpec:
    """``cross_setup``: the host's CPU architecture and its setup, when not the controller's."""
    arch, docker = require_arch(worker), controller.docker
    vendor_image, vendor_service = vendor_environment(worker, controller)
    image = service = None
    if isinstance(docker, DockerSettings):
        chosen = cross_setup[1].image if cross_setup and cross_setup[1].image else None
        chosen = chosen or vendor_image or docker.image
        image = resolve_image(attrs.evolve(docker, image=chosen), arch)
    cross = cross_build(*cross_setup, docker) if cross_setup else None
    if isinstance(docker, ComposeService):
        service = cross.service if cross and cross.service else vendor_service or docker.service
    return BuildSpec(
        arch,
        cargo_features(arch, worker.features),
        image,
        crate_dir,
        command,
        cross,
        mode=controller.build_mode,
        service=service,
    )


def _one_cpu_per_arch(specs: Mapping[str, BuildSpec]) -> None:
    """Every build links against ``<controller.path>/libtorch/<arch>``, whatever its CPU:
    hosts of two CPU architectures cannot share an arch name."""
    seen: dict[str, tuple[str, str]] = {}
    for host, spec in specs.items():
        machine = spec.cpu_arch or "the controller's"
        other = seen.setdefault(spec.arch, (host, machine))
        if other[1] != machine:
            raise FdlError(
                f"hosts {other[0]!r} ({other[1]} CPU) and {host!r} ({machine} CPU) both use arch "
                f"{spec.arch!r}, but every build links against libtorch/{spec.arch} on the "
                f"controller: give each CPU's variant a directory of its own (e.g. "
                f"'{spec.arch}-aarch64')"
            )


def plan_builds(
    workers: Iterable[Worker],
    controller: Controller,
    command: str,
    crate_dir: str,
    shared: bool,
    *,
    cpu_archs: Mapping[str, str] | None = None,
) -> list[BuildJob]:
    """One job per distinct build environment when ``shared``, else one per host.

    ``cpu_archs`` names the hosts whose CPU architecture is not the
    controller's; each needs its ``controller.cross`` setup.
    """
    setups = {}
    for host, cpu_arch in (cpu_archs or {}).items():
        if cpu_arch not in controller.cross:
            raise FdlError(f"host {host!r} is {cpu_arch}, but controller.cross has no entry for it")
        setups[host] = (cpu_arch, controller.cross[cpu_arch])
    workers = tuple(workers)
    check_vendor_builds(workers, controller)
    specs = {
        w.host: build_spec(w, controller, command, crate_dir, setups.get(w.host)) for w in workers
    }
    _one_cpu_per_arch(specs)
    if not shared:
        return [
            BuildJob(host, spec, (host,), host_dir(host, spec.arch, spec.cpu_arch))
            for host, spec in specs.items()
        ]
    groups: dict[BuildSpec, list[str]] = {}
    for host, spec in specs.items():
        groups.setdefault(spec, []).append(host)
    jobs = []
    for spec, hosts in groups.items():
        directory = shared_dir(spec.key)
        jobs.append(BuildJob(directory.rsplit("/", 1)[1], spec, tuple(hosts), directory))
    return jobs


def live_target_dirs(workers: Iterable[Worker], controller: Controller) -> set[str]:
    """Every target dir a prebuild of these workers may use, in either mode, for any
    command: each host's own dir and its build environment's shared dir, for the
    controller's CPU and for each cross setup a host may need (a host's CPU is only
    known after a probe, unless ``cpu_arch`` pins it)."""
    live = set()
    for worker in workers:
        if worker.arch is None:
            continue
        candidates: list[tuple[str, CrossSetup] | None] = [None]
        candidates += [(cpu, setup) for cpu, setup in controller.cross.items()]
        if worker.cpu_arch:
            candidates = [c for c in candidates if c is None or c[0] == worker.cpu_arch]
        for candidate in candidates:
            try:
                spec = build_spec(worker, controller, "-", "", candidate)
            except FdlError:  # an image that needs a CUDA version: no build, no dir
                continue
            live |= {host_dir(worker.host, spec.arch, spec.cpu_arch), shared_dir(spec.key)}
    return live
