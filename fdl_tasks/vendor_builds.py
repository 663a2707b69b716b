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

from fdl_tasks.errors import FdlError
from fdl_tasks.gpus import VENDOR_NAMES, Vendor, vendor_of
from fdl_tasks.model import ComposeService, Controller, DockerSettings, Worker


def _vendor(worker: Worker) -> Vendor:
    return vendor_of(worker.arch or "", worker.features)


def check_vendor_builds(workers: Iterable[Worker], controller: Controller) -> None:
    """Every host's vendor has a build environment of the controller's kind."""
    docker = controller.docker
    for vendor, build in controller.gpu_builds.items():
        where = f"controller.gpu_builds.{vendor}"
        if isinstance(docker, DockerSettings) and not build.image:
            raise FdlError(f"{where} needs an 'image:' (controller.docker is a docker run image)")
        if isinstance(docker, ComposeService) and not build.service:
            raise FdlError(f"{where} needs a 'service:' (controller.docker is a compose service)")
        if docker is None:
            raise FdlError(f"{where}: native builds use this machine's cargo for every vendor")
    if docker is None:
        return
    by_vendor: dict[Vendor, list[str]] = {}
    for worker in workers:
        if worker.arch is not None:
            by_vendor.setdefault(_vendor(worker), []).append(worker.host)
    homeless = [v for v in ("nvidia", "amd") if v in by_vendor and v not in controller.gpu_builds]
    if len(homeless) > 1:
        hosts = "; ".join(f"{VENDOR_NAMES[v]}: {', '.join(by_vendor[v])}" for v in homeless)
        key = "service" if isinstance(docker, ComposeService) else "image"
        raise FdlError(
            f"NVIDIA and AMD hosts but one build environment ({hosts}); nothing was built: "
            f"name the AMD one under controller, e.g. 'gpu_builds: {{amd: {{{key}: ...}}}}'"
        )


def vendor_environment(worker: Worker, controller: Controller) -> tuple[str | None, str | None]:
    """The ``(image, service)`` of the host's vendor entry, ``(None, None)`` for the
    main environment."""
    vendor = _vendor(worker)
    build = controller.gpu_builds.get(vendor) if vendor != "cpu" else None
    return (build.image, build.service) if build else (None, None)
