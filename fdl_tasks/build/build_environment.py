"""The build environment as a value, and a build: that environment, a command and a crate.

Pure. A :class:`BuildEnvironment` is everything that makes two builds of the
same command produce the same binary and that cargo's fingerprint cannot see:
the build mode, the libtorch variant, the cargo features, the toolchain (the
image or the compose service), the GPU vendor, and the CPU architecture with
its cross setup. It depends on a worker and the controller only, never on a
command: ``clean``, the layout, the watch and the GPU gate use it as it is; a
:class:`Build` adds the command and the crate, and a :class:`BuildJob` the hosts
it serves and the target dir it builds in.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from fdl_tasks.config.layout import (
    BuildKey,
    built_binary,
    host_binary,
    host_dir,
    log_file,
    shared_dir,
)
from fdl_tasks.config.model import Arch, BuildMode
from fdl_tasks.gpu.gpus import Vendor


@attrs.frozen
class CrossBuild:
    """A build for hosts of another CPU architecture than the controller's."""

    cpu_arch: str
    target: str
    linker: str
    run_args: tuple[str, ...] | None = None  # docker run mode: instead of docker's
    env: tuple[tuple[str, str], ...] | None = None  # docker run mode: instead of docker's


@attrs.frozen
class NoEnvironment:
    """Why a worker has no build environment (an image that needs a CUDA version, say)."""

    reason: str


@attrs.frozen
class BuildEnvironment:
    """One worker's build environment on this controller."""

    mode: BuildMode
    arch: Arch
    features: tuple[str, ...]
    #: The image (``docker run``) or the service (compose) that builds; ``""`` natively.
    toolchain: str = ""
    vendor: Vendor = "cpu"
    cross: CrossBuild | None = None

    @property
    def cpu_arch(self) -> str | None:
        """The CPU architecture built for, when it is not the controller's."""
        return self.cross.cpu_arch if self.cross else None

    @property
    def key(self) -> BuildKey:
        """What a shared target dir depends on."""
        cross = self.cross
        return BuildKey(
            mode=self.mode,
            arch=self.arch,
            features=self.features,
            environment=self.toolchain,
            cpu_arch=cross.cpu_arch if cross else None,
            rust_target=cross.target if cross else None,
            linker=cross.linker if cross else None,
        )

    @property
    def shared_dir(self) -> str:
        return shared_dir(self.key)

    def host_dir(self, host: str) -> str:
        return host_dir(host, self.arch, self.cpu_arch)


@attrs.frozen
class Build:
    """A build environment, a command (cargo's ``--bin``) and the crate dir it lives in."""

    environment: BuildEnvironment
    command: str
    crate_dir: str
    #: cargo ``--timings`` (its own report in the target dir); changes no output.
    timings: bool = False

    @property
    def arch(self) -> Arch:
        return self.environment.arch

    @property
    def features(self) -> tuple[str, ...]:
        return self.environment.features

    @property
    def cross(self) -> CrossBuild | None:
        return self.environment.cross

    @property
    def cpu_arch(self) -> str | None:
        return self.environment.cpu_arch


@attrs.frozen
class BuildJob:
    """One cargo build, serving one host or several identical ones."""

    name: str
    build: Build
    hosts: tuple[str, ...]
    target_dir: str

    @property
    def built_binary(self) -> str:
        """Where cargo leaves the binary, relative to the project root."""
        cross = self.build.cross
        return built_binary(self.target_dir, self.build.command, cross.target if cross else None)

    def host_binary(self, host: str) -> str:
        return host_binary(host, self.build.arch, self.build.command, self.build.cpu_arch)

    @property
    def log_file(self) -> str:
        return log_file(self.target_dir, self.build.command)


def target_dirs(jobs: Iterable[BuildJob]) -> list[tuple[str, str | None]]:
    """(target dir, Rust target triple of a cross build) of a cycle's builds: where the
    next survey finds their build scripts' ``output`` files."""
    return sorted({(j.target_dir, j.build.cross.target if j.build.cross else None) for j in jobs})
