"""Pure rules: an arch's features and CUDA version, cross targets, names, the controller.

No I/O here; everything is a function of the cluster model and its inputs.
"""

from __future__ import annotations

import re

import attrs

from fdl_tasks.errors import FdlError
from fdl_tasks.gpus import features_for
from fdl_tasks.model import Arch, Cluster, Worker

#: The image template fields an arch's CUDA version fills in.
CUDA_VERSION_FIELD, CUDA_TAG_FIELD = "{cuda_version}", "{cuda_tag}"
#: Environment variable that names the controller's host label.
HOST_NAME_ENV = "FLODL_HOST_NAME"

_SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(?:[ \t]*=[ \t]*|[ \t]+(?!=))(\S.*)")
_CUDA = re.compile(r"cu(\d+)(\d)(?![0-9])")
_CUDA_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_COMMAND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_CRATE_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


def split_ssh_option(option: str) -> tuple[str, str] | None:
    """``Key=Value``, ``Key = Value`` or ``Key Value`` → ``("key", "Value")``, as ssh reads it.

    Only the separator is consumed: an ``=`` inside the value is kept. ``None``
    when there is no key or no value.
    """
    match = _SSH_OPTION.fullmatch(option)
    return (match.group(1).lower(), match.group(2)) if match else None


def cargo_features(arch: Arch, explicit: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The worker's ``features`` when given; else by the variant's vendor, as flodl
    names it (:func:`fdl_tasks.gpus.classify`): none for CPU, ``cuda``, ``rocm``."""
    return features_for(arch, explicit)


@attrs.frozen
class Cuda:
    """A CUDA release as flodl names it: ``version`` has three parts, ``tag`` two."""

    version: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> Cuda | None:
        """``12.8`` → ``12.8.0`` / ``12.8``; ``12.6.3`` → ``12.6.3`` / ``12.6``."""
        match = _CUDA_VERSION.fullmatch(text)
        if match is None:
            return None
        major, minor, patch = match.groups()
        return cls(f"{major}.{minor}.{patch or 0}", f"{major}.{minor}")


def arch_cuda(arch: Arch) -> Cuda | None:
    """``precompiled/cu128`` → CUDA 12.8(.0); source builds and ``cpu`` encode none."""
    match = _CUDA.match(arch.rsplit("/", 1)[-1])
    return Cuda.parse(f"{int(match.group(1))}.{match.group(2)}") if match else None


#: Rust targets and GNU cross compilers by ``uname -m`` machine (Debian's names).
GNU_TARGETS = {
    "x86_64": ("x86_64-unknown-linux-gnu", "x86_64-linux-gnu-gcc"),
    "aarch64": ("aarch64-unknown-linux-gnu", "aarch64-linux-gnu-gcc"),
    "ppc64le": ("powerpc64le-unknown-linux-gnu", "powerpc64le-linux-gnu-gcc"),
    "riscv64": ("riscv64gc-unknown-linux-gnu", "riscv64-linux-gnu-gcc"),
    "armv7l": ("armv7-unknown-linux-gnueabihf", "arm-linux-gnueabihf-gcc"),
}


def cross_env(target: str, linker: str) -> dict[str, str]:
    """cargo's linker for ``target`` and, for build scripts that compile C/C++ (the ``cc``
    crate), the matching compilers: ``CARGO_TARGET_<T>_LINKER``, ``CC_<t>``, ``CXX_<t>``."""
    snake = target.replace("-", "_")
    environment = {f"CARGO_TARGET_{snake.upper()}_LINKER": linker}
    if linker.endswith("gcc"):
        environment |= {f"CC_{snake}": linker, f"CXX_{snake}": linker[: -len("gcc")] + "g++"}
    return environment


def check_command(name: str) -> str:
    """The command is cargo's ``--bin`` name and a file name on every host."""
    if not _COMMAND.fullmatch(name):
        raise FdlError(
            f"command {name!r} is not a valid binary name: use letters, digits, '_' "
            "and '-' (it is passed to cargo as --bin and becomes a file name)"
        )
    return name


def check_crate_dir(relative: str) -> str:
    """The crate directory relative to the project root; ``""`` is the root itself."""
    cleaned = relative.strip("/") if relative not in ("", ".") else ""
    if relative.startswith("/") or (
        cleaned and not all(_CRATE_SEGMENT.fullmatch(s) for s in cleaned.split("/"))
    ):
        raise FdlError(
            f"crate directory {relative!r} must be a relative path inside the project "
            "root, such as 'ddp-bench' (no '..', no absolute path)"
        )
    return cleaned


def controller_label(override: str, env_value: str | None, hostname: str) -> str:
    """The controller's label: task option, else ``FLODL_HOST_NAME``, else the hostname."""
    return override or env_value or hostname


def remote_workers(cluster: Cluster, controller: str) -> tuple[Worker, ...]:
    """Every worker but the controller, compared by label, never by address.

    A container on this machine reached through ``127.0.0.1`` on its own port
    is a distinct host with its own arch, so addresses prove nothing.
    """
    return tuple(w for w in cluster.workers if w.host != controller)


def require_arch(worker: Worker) -> Arch:
    """The arch a prebuild needs, or an error that shows how to declare it."""
    if worker.arch is None:
        raise FdlError(
            f"host {worker.host!r} has no 'arch': prebuild needs each remote host's "
            "libtorch variant, e.g. arch: precompiled/cu128, builds/sm61-sm120 or "
            "precompiled/cpu"
        )
    return worker.arch


def libtorch_dir(root: str, arch: Arch) -> str:
    """``<root>/libtorch/<arch>``, with a trailing ``/`` on root trimmed."""
    return f"{root.rstrip('/')}/libtorch/{arch}"


def join_path(root: str, relative: str) -> str:
    """``root`` joined with a relative path that may be empty."""
    base = root.rstrip("/")
    return f"{base}/{relative}" if relative else (base or "/")
