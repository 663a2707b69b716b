"""One task invocation as a value: what every step of a run needs, in one place."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from invoke.context import Context

from fdl_tasks.config.config_errors import CLUSTER_KEYS, misplaced_cluster_file
from fdl_tasks.config.flodl_layers import FLODL_ENV
from fdl_tasks.config.loader import find_cluster_file, load_cluster
from fdl_tasks.config.model import Cluster, Worker
from fdl_tasks.config.names import HOST_NAME_ENV, controller_label, remote_workers
from fdl_tasks.config.settings import Settings, resolve_cluster_file
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, Severity, report_to_stderr
from fdl_tasks.core.said_notes import cluster_digest, notes_file, parse_state, state_text, to_say
from fdl_tasks.core.standbys import Standbys
from fdl_tasks.core.timeline import Timeline
from fdl_tasks.core.user_cache import cache_home


@attrs.frozen
class Run:
    """Invoke's context, the cluster, which host this is, the settings and the reporter."""

    c: Context
    cluster: Cluster
    controller: str
    settings: Settings
    report: Report = report_to_stderr
    #: What progress lines start with: the task's name.
    task: str = "prebuild"
    #: The controller's label is this machine's hostname (no option, setting or variable).
    by_hostname: bool = False
    #: ``--timings``: where each step records its spans (``None``: not asked for).
    timeline: Timeline | None = None
    #: A ``--watch`` session's builds started ahead in their warm containers.
    standbys: Standbys | None = None

    @classmethod
    def start(
        cls, c: Context, *, label: str = "prebuild", workers_needed: bool = True, **options: Any
    ) -> Run:
        """Settings from ``c.config.fdl`` and the task's options, then the cluster file,
        which must list a worker (unless ``workers_needed`` is false: ``clean``)."""
        config = c.config
        present = [key for key in CLUSTER_KEYS if key in config]
        problem = misplaced_cluster_file(present, getattr(config, "_runtime_path", None), label)
        if problem:
            raise FdlError(problem)
        settings = Settings.from_config(config.get("fdl", {}), **options)
        project = getattr(config, "_project_prefix", None)
        given = options.get("cluster_file") is not None
        chosen = resolve_cluster_file(settings.cluster_file, given, project)
        if not chosen:
            chosen = str(find_cluster_file(Path(project or os.getcwd())))
        env = options.get("env") or os.environ.get(FLODL_ENV) or settings.env
        cluster = load_cluster(chosen, env or None)
        # the file that holds the cluster block: what a watch re-reads and what messages name
        settings = attrs.evolve(settings, cluster_file=cluster.source, env=env)
        from_environment = os.environ.get(HOST_NAME_ENV)
        controller = controller_label(
            settings.controller_host, from_environment, socket.gethostname()
        )
        named = settings.controller_host or from_environment
        if workers_needed and not cluster.workers:
            raise FdlError(
                f"{cluster.source} lists no workers, so there is nothing to {label}: add one "
                "entry per host under 'workers:' (host, ssh, path, arch; docs/cluster-file.md)"
            )
        return cls(c, cluster, controller, settings, task=label, by_hostname=not named)

    def note_unlisted_controller(self) -> None:
        """One line, before any host is contacted, when no host of the cluster file carries
        the controller's label, so every worker is remote, the controller's own entry
        included. Usual (a controller that runs no ranks), so a note, said once
        (:meth:`notes_to_say`); when the label was named, the name is what to check."""
        if any(w.host == self.controller for w in self.cluster.workers):
            return
        source = self.cluster.source
        if self.by_hostname:
            note = (
                f"note: this machine's hostname {self.controller!r} names no host of "
                f"{source}, so every worker is remote; if one is this machine, name it with "
                f"--controller-host, ${HOST_NAME_ENV} or fdl.controller_host"
            )
        else:
            note = (
                f"note: the controller's name {self.controller!r} (--controller-host, "
                f"${HOST_NAME_ENV} or fdl.controller_host) names no host of {source}, so "
                "every worker is remote; if one is this machine, use its label there"
            )
        for line in self.notes_to_say("controller", [note]):
            self.say(line)

    def notes_to_say(self, kind: str, notes: Sequence[str]) -> list[str]:
        """The notes of ``kind`` not said since the cluster files or the notes changed
        (every one with ``-v``), remembered in the user's cache
        (:func:`~fdl_tasks.core.said_notes.notes_file`). Under ``--dry``, or where that file
        cannot be read or written, every one is said."""
        if self.dry:
            return list(notes)
        contents = []
        for name in self.cluster.files:
            try:
                contents.append(Path(name).read_bytes())
            except OSError:
                contents.append(b"")
        path = notes_file(str(self.root), cache_home())
        try:
            state = parse_state(path.read_text(encoding="utf-8")) if path.exists() else {}
        except OSError:
            return list(notes)
        kind = f"{kind} {self.cluster.source}"  # several cluster files: each its own
        now, kept = to_say(notes, kind, cluster_digest(contents), state, self.settings.verbose)
        if kept != state:
            with contextlib.suppress(FdlError):  # said again next time: no harm
                write_atomically(path, state_text(kept))
        return now

    def say(self, text: str, severity: Severity = Severity.PROGRESS) -> None:
        """A line of the task itself: the one place its ``<task>:`` prefix is added."""
        self.report(f"{self.task}: {text}", severity)

    @property
    def dry(self) -> bool:
        """``inv --dry``: print every command, run none."""
        return bool(self.c.config.run.dry)

    @property
    def remotes(self) -> tuple[Worker, ...]:
        """Every worker but the controller (compared by label, never by address)."""
        return remote_workers(self.cluster, self.controller)

    @property
    def root(self) -> Path:
        """The controller's view of the shared project root."""
        return Path(self.cluster.controller.path)
