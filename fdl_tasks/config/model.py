"""The cluster.yaml model: frozen value classes, no I/O.

Validation of single values lives in the kinds below (each an ``Annotated``
alias whose structure hook in :mod:`fdl_tasks.config.loader` checks it), so a bad
value is reported with its exact key path while type checkers still see a
plain ``str``; cross-field rules (duplicate host labels) are checked by the
loader after structuring.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal

import attrs

from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.suggest import close_matches, quoted_choice

#: A host label: used as a directory name under ``target/cluster/``.
HostLabel = Annotated[str, "HostLabel"]
#: A libtorch variant relative to ``<path>/libtorch/``, e.g. ``precompiled/cu128``.
Arch = Annotated[str, "Arch"]
#: An absolute filesystem path as one host sees it.
AbsPath = Annotated[str, "AbsPath"]
#: The value of an environment variable (YAML numbers are accepted and kept as text).
EnvValue = Annotated[str, "EnvValue"]
#: A Docker image reference, possibly with ``{cuda_version}`` / ``{cuda_tag}``.
ImageTemplate = Annotated[str, "ImageTemplate"]
#: A path Docker bind-mounts (``-v SOURCE:TARGET``): absolute, without ``:`` or ``,``.
MountPath = Annotated[str, "MountPath"]
#: A TCP port, 1 to 65535.
Port = Annotated[int, "Port"]
#: One ssh_config-style option, ``Key=Value``.
SshOption = Annotated[str, "SshOption"]
#: An environment variable name.
EnvName = Annotated[str, "EnvName"]
#: A variable a worker's process gets at launch: not one the launcher owns.
LaunchEnvName = Annotated[str, "LaunchEnvName"]
#: A CUDA release such as ``12.8`` or ``12.6.3``.
CudaRelease = Annotated[str, "CudaRelease"]
#: A CPU architecture as ``uname -m`` names it: ``x86_64``, ``aarch64``.
CpuArch = Annotated[str, "CpuArch"]
#: A Rust target triple such as ``aarch64-unknown-linux-gnu``.
RustTarget = Annotated[str, "RustTarget"]
#: A program to run: a command name or an absolute path, one word.
Program = Annotated[str, "Program"]
#: A docker compose service name, flodl's ``controller.docker: cuda``.
ServiceName = Annotated[str, "ServiceName"]
#: flodl's host-RAM share for integrated GPUs: a finite, non-negative number.
RamShare = Annotated[float, "RamShare"]
#: An sccache-dist scheduler's URL: ``http://10.0.0.5:10600``, ``https://sccache.example.org``.
SchedulerUrl = Annotated[str, "SchedulerUrl"]
#: A file on the controller: an absolute path, or one starting with ``~/``.
ControllerFile = Annotated[str, "ControllerFile"]
#: A cargo feature name, such as ``cuda`` or ``rocm``.
CargoFeature = Annotated[str, "CargoFeature"]
#: A GPU vendor that a build environment serves (``controller.gpu_builds``).
GpuVendorName = Annotated[str, "GpuVendorName"]
#: How a host gets its binary: ``shared`` (it sees the project) or ``copy`` (uploaded to it).
DeliveryMode = Annotated[str, "DeliveryMode"]
#: Any JSON string, as serde reads a Rust ``String`` (the envelope's fields).
WireText = Annotated[str, "WireText"]

#: How the controller runs builds (each backend names its own mode).
BuildMode = Literal["native", "docker", "compose"]

#: The data path flodl uses when a host declares none.
DEFAULT_DATA_PATH = "/flodl/data"
#: Marks a field the converter never reads from outside data (its metadata key).
NOT_IN_FILE = "not_in_file"


@attrs.frozen
class SshSettings:
    """How to reach one worker; every field falls back to ssh_config, then Fabric."""

    target: str | None = None
    port: Port | None = None
    user: str | None = None
    identity_file: str | None = None
    options: tuple[SshOption, ...] = ()


@attrs.frozen
class DockerSettings:
    """How the controller runs a build inside a container.

    ``image`` may contain ``{cuda_version}`` / ``{cuda_tag}``; arches that
    encode no CUDA version use ``cuda_version`` instead.
    """

    image: ImageTemplate
    workspace: MountPath = "/workspace"
    libtorch: MountPath = "/opt/libtorch"
    cuda_version: CudaRelease | None = None
    run_args: tuple[str, ...] = ()
    env: Mapping[EnvName, EnvValue] = attrs.field(factory=dict)


@attrs.frozen
class ComposeService:
    """flodl's form, ``controller.docker: cuda``: build with ``docker compose run <service>``.

    The project's compose file decides the image, the user and the mounts; it
    mounts the project at ``/workspace`` and reads the variant from the
    variables flodl sets (``LIBTORCH_HOST_PATH``, ``CUDA_VERSION``, ``CUDA_TAG``).
    """

    service: ServiceName
    workspace: str = "/workspace"


@attrs.frozen
class CrossSetup:
    """How the controller builds for hosts of another CPU architecture.

    Every field has a default: the Rust target and the GNU cross linker that
    Debian and Ubuntu name for the architecture, the ``docker run`` image or
    the compose service of the native builds. ``run_args`` and ``env``, when
    given, replace ``controller.docker``'s for this architecture's builds (a
    cross image rarely wants the mounts that bring the native image its Rust).
    """

    target: RustTarget | None = None
    linker: Program | None = None
    image: ImageTemplate | None = None
    service: ServiceName | None = None
    run_args: tuple[str, ...] | None = None
    env: Mapping[EnvName, EnvValue] | None = None


@attrs.frozen
class DistSettings:
    """Distributed compiles (``controller.dist``): sccache-dist's scheduler and the
    client token, read at build time from a file or a variable (never from this file)."""

    scheduler_url: SchedulerUrl
    token_file: ControllerFile | None = None
    token_env: EnvName | None = None


@attrs.frozen
class VendorBuild:
    """The build environment of one GPU vendor's hosts (``controller.gpu_builds.amd``):
    a ``docker run`` image (docker mode) or a compose service (compose mode)."""

    image: ImageTemplate | None = None
    service: ServiceName | None = None


@attrs.frozen
class Controller:
    """The machine that builds; ``path`` is its view of the shared project root."""

    path: AbsPath
    arch: Arch | None = None
    data_path: AbsPath | None = None
    docker: DockerSettings | ComposeService | None = None
    cross: Mapping[CpuArch, CrossSetup] = attrs.field(factory=dict)
    dist: DistSettings | None = None
    gpu_builds: Mapping[GpuVendorName, VendorBuild] = attrs.field(factory=dict)
    # flodl's own keys: accepted and carried for the launcher, unused here.
    host: Any = None
    port: Any = None
    join: Any = None


@attrs.frozen
class Worker:
    """One host of the rig, the controller itself possibly among them."""

    host: HostLabel
    path: AbsPath
    arch: Arch | None = None
    cpu_arch: CpuArch | None = None
    data_path: AbsPath | None = None
    ssh: SshSettings = SshSettings()
    env: Mapping[LaunchEnvName, EnvValue] = attrs.field(factory=dict)
    gpu_ram_share: RamShare | None = None
    #: cargo features instead of those the arch's name implies (``[rocm]``, ``[]``).
    features: tuple[CargoFeature, ...] | None = None
    delivery: DeliveryMode | None = None  # None: the cluster's ``delivery``
    # flodl's own keys: accepted and carried for the launcher, unused here.
    ranks: Any = None
    local_devices: Any = None
    nccl_socket_ifname: Any = None
    tunnel: Any = None
    docker: Any = None

    @property
    def ssh_target(self) -> str:
        """The address ssh connects to: ``ssh.target``, else the label."""
        return self.ssh.target or self.host


@attrs.frozen
class FlodlOrigin:
    """Where a cluster read from flodl's files came from: what ``fdl @<env>`` will read."""

    #: The flodl project's root (its ``fdl.yml``'s directory); ``None``: no base file.
    root: str | None
    #: The overlay's env (``cluster`` for ``fdl.cluster.yml``); ``None``: the base alone.
    env: str | None
    #: Every layer, in merge order.
    layers: tuple[str, ...]
    #: ``fdl-tasks.yml``, when it added this tool's keys.
    extras: str | None = None


@attrs.frozen
class Cluster:
    """A whole cluster file."""

    controller: Controller
    workers: tuple[Worker, ...] = ()
    env: Mapping[LaunchEnvName, EnvValue] = attrs.field(factory=dict)
    gpu_ram_share: RamShare | None = None
    delivery: DeliveryMode = "shared"
    #: The file it was read from, for messages; set by the loader, never read from the file.
    source: str = attrs.field(default="cluster.yaml", eq=False, metadata={NOT_IN_FILE: True})
    #: Set by the loader for a cluster read from flodl's files.
    origin: FlodlOrigin | None = attrs.field(default=None, eq=False, metadata={NOT_IN_FILE: True})

    @property
    def files(self) -> tuple[str, ...]:
        """Every file this cluster was read from: flodl's layers and ``fdl-tasks.yml``, or
        the one file of this tool's own form (what a watcher re-reads the cluster on)."""
        if self.origin is None:
            return (self.source,)
        extras = (self.origin.extras,) if self.origin.extras else ()
        return (*self.origin.layers, *extras)

    def keeping(self, labels: Collection[str]) -> Cluster:
        """The same cluster with only the workers called ``labels`` (``build-host``'s view:
        its one host probed, as if the only one)."""
        return attrs.evolve(self, workers=tuple(w for w in self.workers if w.host in labels))

    def replacing(self, worker: Worker) -> Cluster:
        """The same cluster with the worker of ``worker``'s label replaced by it."""
        workers = tuple(worker if w.host == worker.host else w for w in self.workers)
        return attrs.evolve(self, workers=workers)

    def worker(self, label: str) -> Worker:
        """The worker called ``label``; a clear error listing the known ones otherwise."""
        for worker in self.workers:
            if worker.host == label:
                return worker
        labels = [w.host for w in self.workers]
        close = close_matches(label, labels, cutoff=0.75)  # labels share prefixes (node-…)
        guess = f" did you mean {quoted_choice(close)}?" if close else ""
        known = ", ".join(labels) or "none"
        raise FdlError(f"unknown host {label!r}:{guess} {self.source} declares {known}")
