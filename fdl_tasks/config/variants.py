"""A libtorch variant (an arch): its directory, its features, the CUDA release it encodes.

Pure; every path to a variant's directory is computed here.
"""

from __future__ import annotations

import attrs

from fdl_tasks.config.model import Arch, Worker
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.gpus import (
    cuda_release,
    features_for,
    named_cuda,
    runtime_library_path,
    vendor_of,
)

#: The image template fields an arch's CUDA version fills in.
CUDA_VERSION_FIELD, CUDA_TAG_FIELD = "{cuda_version}", "{cuda_tag}"


def cargo_features(arch: Arch, explicit: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The worker's ``features`` when given; else by the variant's vendor, as flodl
    names it (:func:`fdl_tasks.gpu.gpus.classify`): none for CPU, ``cuda``, ``rocm``."""
    return features_for(arch, explicit)


@attrs.frozen
class Cuda:
    """A CUDA release as flodl names it: ``version`` has three parts, ``tag`` two."""

    version: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> Cuda | None:
        """``12.8`` → ``12.8.0`` / ``12.8``; ``12.6.3`` → ``12.6.3`` / ``12.6``
        (read by :func:`fdl_tasks.gpu.gpus.cuda_release`, the one parser)."""
        release = cuda_release(text)
        if release is None:
            return None
        major, minor, patch = release
        return cls(f"{major}.{minor}.{patch}", f"{major}.{minor}")


def arch_cuda(arch: Arch) -> Cuda | None:
    """``precompiled/cu128`` → CUDA 12.8(.0); source builds and ``cpu`` encode none."""
    named = named_cuda(arch)
    return Cuda.parse(f"{named[0]}.{named[1]}") if named else None


def require_arch(worker: Worker) -> Arch:
    """The arch a prebuild needs, or an error that shows how to declare it."""
    if worker.arch is None:
        raise FdlError(
            f"host {worker.host!r} has no 'arch': prebuild needs each remote host's "
            "libtorch variant, e.g. arch: precompiled/cu128, builds/sm61-sm120 or "
            "precompiled/cpu"
        )
    return worker.arch


def libtorch_root(root: str) -> str:
    """``<root>/libtorch``: where every variant of a project lives."""
    return f"{root.rstrip('/')}/libtorch"


def libtorch_dir(root: str, arch: Arch) -> str:
    """``<root>/libtorch/<arch>``, with a trailing ``/`` on root trimmed."""
    return f"{libtorch_root(root)}/{arch}"


def variant_lib(root: str, arch: Arch) -> str:
    """``<root>/libtorch/<arch>/lib``: the variant's shared objects."""
    return f"{libtorch_dir(root, arch)}/lib"


def library_path(worker: Worker, arch: Arch) -> str:
    """The ``LD_LIBRARY_PATH`` flodl's launcher gives the worker's binary (the envelope's)."""
    return runtime_library_path(vendor_of(arch, worker.features), variant_lib(worker.path, arch))
