"""Build plans: which builds to run for which hosts, in which target dirs.

Pure logic. A :class:`~fdl_tasks.build.build_environment.BuildJob` is one cargo
invocation; with shared builds, hosts of one build environment share a job,
and each still gets its binary at its own
``target/cluster/<host>/<arch-slug>/release/<cmd>`` (:mod:`fdl_tasks.config.layout`
names every path). What the toolchain is (an image, a service, none) is the
backend's to say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.build_environment import (
    Build,
    BuildEnvironment,
    BuildJob,
    CrossBuild,
    NoEnvironment,
)
from fdl_tasks.build.vendor_builds import check_vendor_builds
from fdl_tasks.cargo.cross_targets import GNU_TARGETS
from fdl_tasks.config.mode_fit import misfits
from fdl_tasks.config.model import CrossSetup, Worker
from fdl_tasks.config.variants import cargo_features, require_arch
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.gpus import vendor_of


def cross_build(cpu_arch: str, setup: CrossSetup) -> CrossBuild:
    """The cross build for ``cpu_arch``: the setup's values, else the GNU defaults."""
    target, linker = GNU_TARGETS.get(cpu_arch, ("", ""))
    env = tuple(setup.env.items()) if setup.env is not None else None
    return CrossBuild(cpu_arch, setup.target or target, setup.linker or linker, setup.run_args, env)


def build_environment(
    worker: Worker, backend: Backend, cpu_arch: str | None = None
) -> BuildEnvironment | NoEnvironment:
    """The worker's build environment; ``cpu_arch``: its CPU architecture, when the
    controller cross-builds for it (``controller.cross`` must have an entry)."""
    arch = require_arch(worker)
    vendor = vendor_of(arch, worker.features)
    setup = backend.controller.cross[cpu_arch] if cpu_arch else None
    toolchain = backend.toolchain(arch, vendor, setup)
    if isinstance(toolchain, NoEnvironment):
        return toolchain
    features = cargo_features(arch, worker.features)
    cross = cross_build(cpu_arch, setup) if cpu_arch and setup else None
    return BuildEnvironment(backend.mode, arch, features, toolchain, vendor, cross)


def _one_cpu_per_arch(specs: Mapping[str, BuildEnvironment]) -> None:
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


def plan_environments(
    workers: Iterable[Worker], backend: Backend, cpu_archs: Mapping[str, str] | None = None
) -> dict[str, BuildEnvironment]:
    """Each worker's build environment, by host: what the builds need, before any command.

    ``cpu_archs`` names the hosts whose CPU architecture is not the
    controller's; each needs its ``controller.cross`` setup.
    """
    cpu_archs = cpu_archs or {}
    for host, cpu_arch in cpu_archs.items():
        if cpu_arch not in backend.controller.cross:
            raise FdlError(f"host {host!r} is {cpu_arch}, but controller.cross has no entry for it")
    workers = tuple(workers)
    if problems := misfits(backend.controller):
        raise FdlError(problems[0])
    check_vendor_builds(workers, backend)
    environments = {}
    for worker in workers:
        environment = build_environment(worker, backend, cpu_archs.get(worker.host))
        if isinstance(environment, NoEnvironment):
            raise FdlError(environment.reason)
        environments[worker.host] = environment
    _one_cpu_per_arch(environments)
    return environments


def plan_builds(
    workers: Iterable[Worker],
    backend: Backend,
    command: str,
    crate_dir: str,
    shared: bool,
    *,
    cpu_archs: Mapping[str, str] | None = None,
) -> list[BuildJob]:
    """One job per distinct build environment when ``shared``, else one per host
    (``cpu_archs``: as :func:`plan_environments`)."""
    environments = plan_environments(workers, backend, cpu_archs)
    builds = {host: Build(e, command, crate_dir) for host, e in environments.items()}
    if not shared:
        return [
            BuildJob(host, build, (host,), build.environment.host_dir(host))
            for host, build in builds.items()
        ]
    groups: dict[Build, list[str]] = {}
    for host, build in builds.items():
        groups.setdefault(build, []).append(host)
    jobs = []
    for build, hosts in groups.items():
        directory = build.environment.shared_dir
        jobs.append(BuildJob(directory.rsplit("/", 1)[1], build, tuple(hosts), directory))
    return jobs


def live_target_dirs(workers: Iterable[Worker], backend: Backend) -> set[str]:
    """Every target dir a prebuild of these workers may use, in either mode, for any
    command: each host's own dir and its build environment's shared dir, for the
    controller's CPU and for each cross setup a host may need (a host's CPU is only
    known after a probe, unless ``cpu_arch`` pins it). A worker with no build
    environment (an image that needs a CUDA version) has no dir."""
    live = set()
    for worker in workers:
        if worker.arch is None:
            continue
        candidates: list[str | None] = [None, *backend.controller.cross]
        if worker.cpu_arch:
            candidates = [c for c in candidates if c is None or c == worker.cpu_arch]
        for cpu_arch in candidates:
            environment = build_environment(worker, backend, cpu_arch)
            if isinstance(environment, BuildEnvironment):
                live |= {environment.host_dir(worker.host), environment.shared_dir}
    return live
