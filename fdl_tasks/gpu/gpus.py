"""GPU vendors and facts: a variant's vendor from its name, what the GPU tools print.

Pure logic. flodl names a libtorch variant's GPU stack by the variant's
basename (``cpu``, ``cu128``, ``sm61-sm120``, ``rocm6.2``, ``gfx1030``); the
probe asks ``nvidia-smi``, ``rocminfo`` or the kernel's KFD topology which
GPUs a host has, and this module reads their answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import attrs

Vendor = Literal["cpu", "nvidia", "amd"]

#: The cargo features each vendor's variants build with (flodl's ``cuda`` / ``rocm``).
FEATURES: dict[Vendor, tuple[str, ...]] = {"cpu": (), "nvidia": ("cuda",), "amd": ("rocm",)}
#: Where an AMD host's system ROCm runtime lives, as flodl spells it for a remote host.
ROCM_SYSTEM_LIB = "/opt/rocm/lib"
#: What people call each vendor in messages.
VENDOR_NAMES: dict[Vendor, str] = {"cpu": "CPU-only", "nvidia": "NVIDIA", "amd": "AMD"}

_NVIDIA_NAME = re.compile(r"(?:cu|sm)\d")
_AMD_NAME = re.compile(r"(?:rocm|gfx)\d")
_CUDA_NAME = re.compile(r"cu(\d+)(\d)(?![0-9])")
_CUDA_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def basename(arch: str) -> str:
    return arch.rstrip("/").rsplit("/", 1)[-1]


def cuda_release(text: str) -> tuple[str, str, str] | None:
    """``12.8`` → ``("12", "8", "0")``, ``12.6.3`` → ``("12", "6", "3")``: a CUDA release
    as an ``.arch`` file's ``cuda=`` or a ``cuda_version`` setting writes it, its digits
    kept as written (an image tag repeats them); ``None`` for anything else."""
    match = _CUDA_RELEASE.fullmatch(text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return major, minor, patch or "0"


def named_cuda(arch: str) -> tuple[int, int] | None:
    """``precompiled/cu128`` → ``(12, 8)``: the CUDA release a variant's basename encodes
    (flodl's ``cu<major><minor>``); source builds and ``cpu`` encode none."""
    match = _CUDA_NAME.match(basename(arch))
    return (int(match.group(1)), int(match.group(2))) if match else None


def classify(arch: str) -> Vendor | None:
    """flodl's naming convention: ``cpu``/``cpu-*`` CPU-only; ``cu<digit>``/``sm<digit>``
    NVIDIA; ``rocm<digit>``/``gfx<digit>`` AMD; ``None`` for any other basename."""
    name = basename(arch)
    if name == "cpu" or name.startswith("cpu-"):
        return "cpu"
    if _NVIDIA_NAME.match(name):
        return "nvidia"
    if _AMD_NAME.match(name):
        return "amd"
    return None


def vendor_of(arch: str, features: tuple[str, ...] | None = None) -> Vendor:
    """The vendor a host's binary is built for: its explicit ``features`` when given
    (``rocm`` → AMD, ``cuda`` → NVIDIA, neither → CPU), else the variant's name, and
    NVIDIA for a name no convention matches (as flodl, which warns: see
    :func:`unknown_name_warning`)."""
    if features is not None:
        return "amd" if "rocm" in features else "nvidia" if "cuda" in features else "cpu"
    return classify(arch) or "nvidia"


def features_for(arch: str, features: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The host's cargo features: the explicit list when given, else its vendor's."""
    return features if features is not None else FEATURES[vendor_of(arch)]


def unknown_name_warning(arch: str) -> str | None:
    """The warning for a variant whose basename matches no convention (``None`` otherwise)."""
    if classify(arch) is not None:
        return None
    return (
        f"libtorch variant {arch!r}: basename {basename(arch)!r} matches no naming convention "
        "(cpu / cu<N> / sm<N> / rocm<N> / gfx<N>), so it is built as NVIDIA (--features cuda); "
        "rename it, or say it on the worker: 'features: [rocm]' for AMD, 'features: [cuda]' "
        "for NVIDIA, 'features: []' for CPU-only"
    )


def runtime_library_path(vendor: Vendor, libtorch_lib: str) -> str:
    """The envelope's ``LD_LIBRARY_PATH``, byte for byte flodl's: on AMD the system ROCm
    first (libtorch-rocm bundles the user-space ROCm stack; with the bundle first, a
    mismatch with the host's kernel driver crashes at the first GPU operation)."""
    return f"{ROCM_SYSTEM_LIB}:{libtorch_lib}" if vendor == "amd" else libtorch_lib


@attrs.frozen
class Gpu:
    """One GPU a host reported. ``target``: NVIDIA's compute capability (``8.6``) or
    AMD's gfx target (``gfx90a``); ``None`` when the tool could not say."""

    vendor: Vendor
    index: int
    name: str
    target: str | None
    driver: str | None = None

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.frozen
class GpuReport:
    """What a host's GPU tools answered. ``tools``: the tools found (``nvidia-smi``,
    ``rocminfo``, ``kfd`` for the sysfs topology); ``gpus`` every GPU they listed."""

    tools: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] = ()

    @property
    def vendors(self) -> set[Vendor]:
        return {gpu.vendor for gpu in self.gpus}

    def to_json(self) -> dict[str, object]:
        return {"tools": list(self.tools), "gpus": [g.to_json() for g in self.gpus]}


def _known(value: str) -> str | None:
    """nvidia-smi prints ``[N/A]`` or ``[Not Supported]`` for what it does not know."""
    return None if not value or value.startswith("[") else value


def parse_nvidia_smi(lines: Iterable[str], with_capability: bool = True) -> tuple[Gpu, ...]:
    """``index, name, compute_cap, driver_version`` csv lines (``noheader``); without
    ``with_capability`` the older drivers' ``index, name, driver_version``. A GPU name
    may itself hold commas: the fields are counted from both ends."""
    gpus = []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        wanted = 4 if with_capability else 3
        if len(fields) < wanted or not fields[0].isdigit():
            continue
        cap = _known(fields[-2]) if with_capability else None
        name = ", ".join(fields[1 : len(fields) - (2 if with_capability else 1)])
        gpus.append(Gpu("nvidia", int(fields[0]), name, cap, _known(fields[-1])))
    return tuple(gpus)


_ROCMINFO_FIELD = re.compile(r"\s*(Name|Marketing Name|Device Type):\s*(.*?)\s*$")
_GFX = re.compile(r"gfx[0-9a-f]+")


def parse_rocminfo(lines: Iterable[str]) -> tuple[Gpu, ...]:
    """rocminfo's agents: each agent's ``Name:`` (``gfx90a`` for a GPU), ``Marketing
    Name:`` and ``Device Type:``; CPU agents and ISA names (indented deeper, and
    ``amdgcn-amd-amdhsa--gfx90a:xnack-``) are skipped. GPU indexes count GPUs only,
    as HIP numbers its devices."""
    agents: list[dict[str, str]] = []
    for line in lines:
        match = _ROCMINFO_FIELD.match(line)
        if not match:
            continue
        key, value = match.groups()
        if key == "Name" and (not agents or "Device Type" in agents[-1] or key in agents[-1]):
            agents.append({})
        if agents and key not in agents[-1]:
            agents[-1][key] = value
    gpus = [a for a in agents if a.get("Device Type") == "GPU"]
    return tuple(
        Gpu(
            "amd",
            index,
            agent.get("Marketing Name") or agent.get("Name", ""),
            agent["Name"] if _GFX.fullmatch(agent.get("Name", "")) else None,
        )
        for index, agent in enumerate(gpus)
    )


def gfx_from_kfd(version: int) -> str | None:
    """KFD's ``gfx_target_version`` (major*10000 + minor*100 + stepping) → ``gfx<M><m><s>``
    with minor and stepping in hex, as LLVM names targets: 90010 → ``gfx90a``,
    100300 → ``gfx1030``; 0 (a CPU node) → ``None``."""
    if version <= 0:
        return None
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_kfd(values: Iterable[str]) -> tuple[Gpu, ...]:
    """``<node>:<gfx_target_version>`` pairs from the sysfs topology; CPU nodes skipped."""
    gpus: list[Gpu] = []
    for value in values:
        node, _, version = value.partition(":")
        target = gfx_from_kfd(int(version)) if version.strip().isdigit() else None
        if target is not None:
            gpus.append(Gpu("amd", len(gpus), f"KFD node {node.strip()}", target))
    return tuple(gpus)
