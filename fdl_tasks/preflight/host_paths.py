"""What a remote host must have in its own view before any build: its ``path``, its variant's
``lib/`` there, and the command's working directory once the command is known.

Pure logic: the probe's shell lines (answered in preflight's one round trip, as
``path=``, ``libtorch=``, ``workdir=``), and the errors read from the answers.
A typo in a worker's ``path`` is then refused in seconds, on that host, instead
of after every build, by delivery verification.
"""

from __future__ import annotations

import shlex

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.names import join_path
from fdl_tasks.config.variants import variant_lib
from fdl_tasks.gpu.auto_arch import AUTO

#: The probe's keys, in the order a missing one explains the next ones.
KEYS = ("path", "libtorch", "workdir")


@attrs.frozen
class HostPaths:
    """The directories one host is asked about; ``""``: not asked."""

    path: str
    #: ``<path>/libtorch/<arch>/lib``: not asked without an arch (none, or ``auto``).
    libtorch: str = ""
    #: ``<path>/<crate dir>``, where launch runs the command: not asked before the crate
    #: dir is known, nor on a copy host (the copy step makes it).
    workdir: str = ""
    #: A copy host: its variant is its own (pushed), not the project's on a shared mount.
    copy: bool = False
    #: The cluster file, named in the errors.
    source: str = "cluster.yaml"

    @classmethod
    def for_worker(cls, worker: Worker, crate: str | None, source: str) -> HostPaths:
        copy = worker.delivery == "copy"
        arch = worker.arch if worker.arch != AUTO else None
        libtorch = variant_lib(worker.path, arch) if arch else ""
        workdir = join_path(worker.path, crate) if crate and not copy else ""
        return cls(worker.path, libtorch, workdir, copy, source)

    def lines(self) -> list[str]:
        """``key=ok`` or ``key=missing`` for each directory asked about."""
        asked = zip(KEYS, (self.path, self.libtorch, self.workdir), strict=True)
        return [
            f"if [ -d {shlex.quote(d)} ]; then echo {key}=ok; else echo {key}=missing; fi"
            for key, d in asked
            if d
        ]

    def errors(self, host: str, missing: frozenset[str]) -> list[str]:
        """One error for the first missing directory (the later ones follow from it)."""
        if "path" in missing:
            return [
                f"path {self.path} does not exist on this host: fix this worker's 'path' in "
                f"{self.source} (the project root as this host sees it)"
            ]
        if "libtorch" in missing and self.copy:
            return [
                f"libtorch variant not found at {self.libtorch}: a copy host needs its own "
                f"(inv push-libtorch --host {host} puts it there)"
            ]
        if "libtorch" in missing:
            return [
                f"libtorch variant not found at {self.libtorch} in this host's view of the "
                f"project: a typo in this worker's 'path' or 'arch' in {self.source}, or the "
                "shared mount is not the controller's project?"
            ]
        if "workdir" in missing:
            return [
                f"the command's working directory {self.workdir} does not exist on this host: "
                f"is this worker's 'path' in {self.source} the project root as this host "
                "sees it?"
            ]
        return []
