"""Which build environment serves each GPU vendor's hosts.

Pure logic. flodl's single ``controller.docker`` (an image or a compose
service) builds every host, as before. A rig with NVIDIA and AMD hosts needs
two toolchains (the CUDA and the ROCm one rarely share an image), so
``controller.gpu_builds`` may name one per vendor; the main environment
serves CPU hosts and the vendor that has no entry. When both GPU vendors would
fall to the main environment, the hosts are refused before any build.
"""

from __future__ import annotations

from collections.abc import Iterable

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.config.model import Worker
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.gpus import VENDOR_NAMES, Vendor, vendor_of


def check_vendor_builds(workers: Iterable[Worker], backend: Backend) -> None:
    """NVIDIA and AMD hosts cannot share the main build environment (native cargo builds
    every vendor; whether each entry names what the mode builds with is the loader's)."""
    if backend.mode == "native":
        return
    gpu_builds = backend.controller.gpu_builds
    by_vendor: dict[Vendor, list[str]] = {}
    for worker in workers:
        if worker.arch is not None:
            by_vendor.setdefault(vendor_of(worker.arch, worker.features), []).append(worker.host)
    homeless = [v for v in ("nvidia", "amd") if v in by_vendor and v not in gpu_builds]
    if len(homeless) > 1:
        hosts = "; ".join(f"{VENDOR_NAMES[v]}: {', '.join(by_vendor[v])}" for v in homeless)
        key = backend.toolchain_key
        raise FdlError(
            f"NVIDIA and AMD hosts but one build environment ({hosts}); nothing was built: "
            f"name the AMD one under controller, e.g. 'gpu_builds: {{amd: {{{key}: ...}}}}'"
        )
