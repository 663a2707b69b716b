"""The ``Backend`` protocol: what the rest of the code asks of a build mode.

In a module of its own so that importing the type imports no backend. Only
backends know which mode they are: the toolchain a build uses (an image, a
service), the settings that fit the mode, the container's mounts, the checks
before any build, a build's command line with the compile cache wired in, and
how to stop one build or the whole run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fdl_tasks.build.build_environment import BuildEnvironment, BuildJob, NoEnvironment
from fdl_tasks.build.build_record import RecordInputs
from fdl_tasks.build.warm_containers_io import WarmContainers
from fdl_tasks.cache.compile_cache import CompileCache
from fdl_tasks.config.model import Arch, BuildMode, Controller, CrossSetup
from fdl_tasks.gpu.gpus import Vendor


class RunBackend:
    """What every backend is made with: the controller, the cluster file's name (for
    messages), the run's id (container labels, cache sockets), its compile cache, and its
    warm build containers (``None``: a container per build; modes without any ignore it)."""

    def __init__(
        self,
        controller: Controller,
        source: str,
        run_id: str,
        cache: CompileCache | None,
        warm: WarmContainers | None = None,
    ) -> None:
        self.controller, self.source, self.run_id, self.cache = controller, source, run_id, cache
        self.warm = warm

    def stand_by(self, job: BuildJob) -> None:
        """Nothing to start ahead: the mode has no warm containers."""


class Backend(Protocol):
    """How one build mode chooses its toolchain, checks, runs and stops builds."""

    #: What may have killed a build that ended by SIGKILL or SIGTERM, for the user.
    killers: str
    #: The mode's name, part of every shared target dir's key.
    mode: BuildMode
    #: What a vendor's ``controller.gpu_builds`` entry names here (``image``, ``service``).
    toolchain_key: str
    controller: Controller
    #: The run's constants, given at construction: its id (labels, sockets) and the
    #: compile cache (``None``: off), wired in as the mode needs it.
    run_id: str
    cache: CompileCache | None

    @property
    def tool(self) -> str:
        """What runs the builds, for the user: ``native cargo``, ``docker run``, …"""

    def toolchain(
        self, arch: Arch, vendor: Vendor, cross: CrossSetup | None
    ) -> str | NoEnvironment:
        """The image or service that builds this variant for this vendor and CPU (``""``
        when the mode has none), or why there is none."""

    def mounts(self) -> list[tuple[str, str | None]]:
        """Container path → controller path of a build's mounts (``None``: the variant)."""

    def check(self, environments: Sequence[BuildEnvironment]) -> None:
        """Before any build (and in preflight): every tool and image these build
        environments need is there (else FdlError)."""

    def stand_by(self, job: BuildJob) -> None:
        """Beside preflight, for a build its look says will run: start ahead what the
        build will run in, where that makes and changes nothing (a standby in its warm
        container, :mod:`fdl_tasks.core.standbys`)."""

    def build_line(self, job: BuildJob) -> str:
        """The job's whole shell command line, every value quoted."""

    def exit_problem(self, exit_code: int, log_tail: str) -> str | None:
        """A build's non-zero exit said as the mode's tool's own failure (the docker
        client's exit 125), or ``None`` when the exit code is cargo's."""

    def record_inputs(self, job: BuildJob) -> RecordInputs:
        """What the job's build reads besides the project's files and its variant
        (:class:`~fdl_tasks.build.build_record.RecordInputs`); its identity ``None`` when the
        mode cannot tell (its builds always run cargo)."""

    def stop_job(self, job: BuildJob, process: int | None) -> list[str]:
        """Stop one build now (its timeout expired, or the run is stopping); what could not
        be stopped, each a line naming it and the command that removes it."""

    def stop_run(self) -> list[str]:
        """After every job was stopped: whatever of the run may still be left (as
        :meth:`stop_job`, what could not be removed)."""

    def run_note(self) -> str:
        """How the user finds this run's builds outside the tool ('' if nothing to say)."""
