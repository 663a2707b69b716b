"""One backend per build mode: native cargo, ``docker run``, docker compose.

The rest of the code never asks which mode it is in: it asks the run's
backend (:func:`backend_for`) for the checks before any build, a job's
command line (with the compile cache wired in as that mode needs it), and
how to stop one job or the whole run. A new mode is a new module here and
one line in :func:`backend_for`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fdl_tasks.backends.compose import ComposeBackend
from fdl_tasks.backends.docker_run import DockerRunBackend
from fdl_tasks.backends.native import NativeBackend
from fdl_tasks.build_plan import BuildJob
from fdl_tasks.cache import CompileCache
from fdl_tasks.docker_tools import find_compose
from fdl_tasks.model import Cluster, ComposeService, DockerSettings


class Backend(Protocol):
    """How one build mode checks, runs and stops builds."""

    #: What runs the builds, for the user: ``native cargo``, ``docker run``, …
    tool: str
    #: What may have killed a build that ended by SIGKILL or SIGTERM, for the user.
    killers: str

    def check(self, jobs: Sequence[BuildJob]) -> None:
        """Before any build: every tool and image the jobs need is there (else FdlError)."""

    def build_line(self, job: BuildJob, run_id: str, cache: CompileCache | None) -> str:
        """The job's whole shell command line, every value quoted."""

    def stop_job(
        self, job: BuildJob, run_id: str, process: int | None, cache: CompileCache | None
    ) -> list[str]:
        """Stop one build now (its timeout expired, or the run is stopping); what could not
        be stopped, each a line naming it and the command that removes it."""

    def stop_run(self, run_id: str) -> list[str]:
        """After every job was stopped: whatever of the run may still be left (as
        :meth:`stop_job`, what could not be removed)."""

    def run_note(self, run_id: str) -> str:
        """How the user finds this run's builds outside the tool ('' if nothing to say)."""


def backend_for(cluster: Cluster) -> Backend:
    """The backend of ``controller.docker``: absent, an image, or a compose service."""
    controller, source = cluster.controller, cluster.source
    docker = controller.docker
    if isinstance(docker, ComposeService):
        return ComposeBackend(controller, docker, find_compose(), source)
    if isinstance(docker, DockerSettings):
        return DockerRunBackend(controller, docker, source)
    return NativeBackend(controller, source)
