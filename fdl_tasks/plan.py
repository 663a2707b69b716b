"""Build plans: which builds to run for which hosts, and the exact command lines.

Pure logic. A :class:`BuildJob` is one cargo invocation; with shared builds,
hosts whose builds would be identical share a job, and each still gets its
binary at its own ``target/cluster/<host>/<arch-slug>/release/<cmd>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import attrs

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Arch, ComposeService, CrossSetup, DockerSettings, Worker
from fdl_tasks.rules import (
    CLUSTER_TARGET,
    CUDA_TAG_FIELD,
    CUDA_VERSION_FIELD,
    GNU_TARGETS,
    PROFILE_DIR,
    Cuda,
    arch_cuda,
    binary_path,
    build_slug,
    cargo_features,
    require_arch,
    target_dir,
)

#: Shared build trees live here; host labels cannot start with ``_``.
SHARED_DIR = f"{CLUSTER_TARGET}/_shared"


@attrs.frozen
class CrossBuild:
    """A build for hosts of another CPU architecture than the controller's."""

    machine: str
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

    @property
    def machine_suffix(self) -> str | None:
        """The CPU architecture in directory names, for cross builds only."""
        return self.cross.machine if self.cross else None


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
        target = f"{self.spec.cross.target}/" if self.spec.cross else ""
        return f"{self.target_dir}/{target}{PROFILE_DIR}/{self.spec.command}"

    def host_binary(self, host: str) -> str:
        return binary_path(host, self.spec.arch, self.spec.command, self.spec.machine_suffix)

    @property
    def log_file(self) -> str:
        return f"{self.target_dir}/build.log"


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
    machine: str, setup: CrossSetup, docker: DockerSettings | ComposeService | None
) -> CrossBuild:
    """The cross build for ``machine``: the setup's values, else the GNU defaults."""
    target, linker = GNU_TARGETS.get(machine, ("", ""))
    service = (setup.service or docker.service) if isinstance(docker, ComposeService) else None
    env = tuple(setup.env.items()) if setup.env is not None else None
    return CrossBuild(
        machine, setup.target or target, setup.linker or linker, service, setup.run_args, env
    )


def build_spec(
    worker: Worker,
    docker: DockerSettings | ComposeService | None,
    command: str,
    crate_dir: str,
    cross: tuple[str, CrossSetup] | None = None,
) -> BuildSpec:
    """``cross``: the host's CPU architecture and its setup, when it is not the controller's."""
    arch = require_arch(worker)
    image = None
    if isinstance(docker, DockerSettings):
        chosen = cross[1].image if cross and cross[1].image else docker.image
        image = resolve_image(attrs.evolve(docker, image=chosen), arch)
    build = cross_build(cross[0], cross[1], docker) if cross else None
    return BuildSpec(arch, cargo_features(arch), image, crate_dir, command, build)


def _shared_name(spec: BuildSpec) -> str:
    identity = attrs.astuple(spec)[:-1] if spec.cross is None else attrs.astuple(spec)
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:10]
    return f"_shared/{build_slug(spec.arch, spec.machine_suffix)}-{digest}"


def _one_cpu_per_arch(specs: Mapping[str, BuildSpec]) -> None:
    """Every build links against ``<controller.path>/libtorch/<arch>``, whatever its CPU:
    hosts of two CPU architectures cannot share an arch name."""
    seen: dict[str, tuple[str, str]] = {}
    for host, spec in specs.items():
        machine = spec.cross.machine if spec.cross else "the controller's"
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
    docker: DockerSettings | ComposeService | None,
    command: str,
    crate_dir: str,
    shared: bool,
    *,
    machines: Mapping[str, str] | None = None,
    cross: Mapping[str, CrossSetup] | None = None,
) -> list[BuildJob]:
    """One job per distinct build when ``shared``, else one per host.

    ``machines`` names the hosts whose CPU architecture is not the controller's;
    each needs its ``cross`` setup.
    """
    setups = {}
    for host, machine in (machines or {}).items():
        if machine not in (cross or {}):
            raise FdlError(f"host {host!r} is {machine}, but controller.cross has no entry for it")
        setups[host] = (machine, (cross or {})[machine])
    specs = {w.host: build_spec(w, docker, command, crate_dir, setups.get(w.host)) for w in workers}
    _one_cpu_per_arch(specs)
    if not shared:
        return [
            BuildJob(host, spec, (host,), target_dir(host, spec.arch, spec.machine_suffix))
            for host, spec in specs.items()
        ]
    groups: dict[BuildSpec, list[str]] = {}
    for host, spec in specs.items():
        groups.setdefault(spec, []).append(host)
    return [
        BuildJob(_shared_name(spec), spec, tuple(hosts), f"{CLUSTER_TARGET}/{_shared_name(spec)}")
        for spec, hosts in groups.items()
    ]
