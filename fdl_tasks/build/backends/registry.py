"""Which backend serves a cluster: chosen by the type of ``controller.docker``."""

from __future__ import annotations

from collections.abc import Callable

from fdl_tasks.build.backends.compose import ComposeBackend
from fdl_tasks.build.backends.docker_run import DockerRunBackend
from fdl_tasks.build.backends.native import NativeBackend
from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.warm_containers_io import WarmContainers
from fdl_tasks.cache.compile_cache import CompileCache
from fdl_tasks.config.model import Cluster, ComposeService, Controller, DockerSettings

#: ``controller.docker``'s type → its backend: absent, an image, or a compose service.
Make = Callable[[Controller, str, str, CompileCache | None, WarmContainers | None], Backend]
BACKENDS: dict[type[object], Make] = {
    type(None): NativeBackend,
    DockerSettings: DockerRunBackend,
    ComposeService: ComposeBackend,
}


def backend_for(
    cluster: Cluster,
    run_id: str = "",
    cache: CompileCache | None = None,
    warm: WarmContainers | None = None,
) -> Backend:
    """The backend of the cluster's build mode, with the run's constants (a run that builds
    nothing, such as ``clean`` or the loader, needs none); it runs nothing until asked."""
    controller = cluster.controller
    return BACKENDS[type(controller.docker)](controller, cluster.source, run_id, cache, warm)
