"""``arch: auto``: the host's variant chosen among those installed on the controller.

Pure logic. A candidate must be of the host's GPU vendor (CPU-only for a host
whose GPU tools list no GPU, or that has none), built for its CPU, cover every
GPU (``.arch``'s ``archs=``) and, on NVIDIA, need no newer driver than the
host's. Among several, the order is: the newest CUDA (NVIDIA) or ROCm (AMD)
release, then ``precompiled`` before ``builds``, then the name; so the choice is
the same from run to run while the installed variants and the GPUs stay.
"""

from __future__ import annotations

import re

import attrs

from fdl_tasks.gpu.coverage import (
    ArchFile,
    amd_covered,
    driver_supports,
    nvidia_covered,
    variant_cuda,
)
from fdl_tasks.gpu.gpus import VENDOR_NAMES, GpuReport, Vendor, basename, classify

#: What a worker writes to have its variant chosen.
AUTO = "auto"

_ROCM_NAME = re.compile(r"rocm(\d+)\.?(\d*)")


@attrs.frozen
class Installed:
    """A variant under ``<controller.path>/libtorch``; ``cpu_arch`` its libtorch's CPU."""

    arch: str
    info: ArchFile | None
    cpu_arch: str | None


@attrs.frozen
class Choice:
    """The chosen arch (``None``: no candidate) and, for each variant, why it was refused."""

    arch: str | None
    refused: tuple[tuple[str, str], ...]

    def summary(self) -> str:
        return "; ".join(f"{arch}: {why}" for arch, why in self.refused) or "none installed"


def _release(item: Installed, vendor: Vendor) -> tuple[int, int]:
    if vendor == "nvidia":
        return variant_cuda(item.arch, item.info) or (0, 0)
    match = _ROCM_NAME.match(basename(item.arch))
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (0, 0)


def rank(item: Installed, vendor: Vendor) -> tuple[tuple[int, int], bool, str]:
    """Sort key, best first: the newest release, ``precompiled/`` first, then the name."""
    major, minor = _release(item, vendor)
    return (-major, -minor), not item.arch.startswith("precompiled/"), item.arch


def _refusal(item: Installed, vendor: Vendor, report: GpuReport, cpu: str | None) -> str | None:
    """Why ``item`` cannot serve the host, ``None`` when it can."""
    own = classify(item.arch) or "nvidia"
    if own != vendor:
        return f"{VENDOR_NAMES[own]} variant, the host is {VENDOR_NAMES[vendor]}"
    if cpu and item.cpu_arch and item.cpu_arch != cpu:
        return f"built for {item.cpu_arch}, the host is {cpu}"
    if vendor == "cpu":
        return None
    if item.info is None or item.info.archs is None:
        return "no .arch archs= line: its GPU coverage is unknown"
    covered = nvidia_covered if vendor == "nvidia" else amd_covered
    for gpu in report.gpus:
        if gpu.vendor != vendor:
            continue
        if gpu.target is None:
            return f"GPU {gpu.index} ({gpu.name}) reports no architecture to match"
        if not covered(gpu.target, item.info.archs):
            return f"does not cover GPU {gpu.index} ({gpu.name}, {gpu.target})"
        cuda = variant_cuda(item.arch, item.info) if vendor == "nvidia" else None
        if vendor == "nvidia" and cuda is None:
            return "its CUDA release is unknown (no cuda= in .arch)"
        if cuda and driver_supports(gpu.driver, cuda) is not True:
            return f"CUDA {cuda[0]}.{cuda[1]} needs a newer driver than {gpu.driver}"
    return None


def host_vendor(report: GpuReport) -> Vendor:
    """NVIDIA if the host has NVIDIA GPUs, else AMD if AMD ones, else CPU-only."""
    vendors = report.vendors
    return "nvidia" if "nvidia" in vendors else "amd" if "amd" in vendors else "cpu"


def choose(installed: list[Installed], report: GpuReport, cpu_arch: str | None) -> Choice:
    """The best candidate for the host, or none with every variant's reason."""
    vendor = host_vendor(report)
    refused: list[tuple[str, str]] = []
    fitting = []
    for item in installed:
        if (why := _refusal(item, vendor, report, cpu_arch)) is None:
            fitting.append(item)
        else:
            refused.append((item.arch, why))
    if not fitting:
        return Choice(None, tuple(sorted(refused)))
    best = min(fitting, key=lambda item: rank(item, vendor))
    return Choice(best.arch, tuple(sorted(refused)))
