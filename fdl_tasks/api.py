"""The functions another project's tasks may call: typed, returning values of their own.

``prebuild`` and ``preflight`` are what the Invoke tasks of the same names
run, minus the command line: a typed :class:`Settings` (or ``c.config.fdl``),
an :class:`~fdl_tasks.core.errors.FdlError` when something is wrong (the tasks turn it
into a message and exit 1; 4 for ``LoginRefused``, 5 for ``NothingVerified``), and
a small frozen value back, never one of the pipeline's own classes: those may change.

They are a library's: they touch no signal handler, no ``sys.excepthook`` and no
process environment (the tasks do, as a program's), so they may run on any thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
from invoke.context import Context

import fdl_tasks.publish.pipeline as pipeline
from fdl_tasks.cargo.binaries import check_binary
from fdl_tasks.config.names import check_command
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings, resolve_cluster_file
from fdl_tasks.preflight import probe
from fdl_tasks.timings.recording import recorded

__all__ = ["HostBinary", "Published", "Settings", "Verdict", "prebuild", "preflight", "settings_of"]


@attrs.frozen(kw_only=True)
class HostBinary:
    """One host's published binary."""

    host: str
    #: The binary relative to the host's ``path``, as the envelope names it.
    binary: str
    #: The SHA-256 of what cargo built for the host.
    sha256: str
    #: Whether cargo wrote a new binary (``False``: it was up to date).
    rebuilt: bool
    #: Whether the host was asked and sees a runnable copy (never, with ``verify`` off).
    verified: bool
    #: How the binary reaches the host: ``shared`` storage or a ``copy``.
    delivery: str


@attrs.frozen(kw_only=True)
class Verdict:
    """One host's preflight result."""

    host: str
    status: Literal["ok", "warning", "error"]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    #: What could not be checked: reported, never changing the status.
    notes: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Published:
    """What a prebuild published: the envelope, and each host's binary."""

    command: str
    #: The envelope exactly as published (``$FLODL_INTERNAL_PREBUILD_PER_HOST``'s value).
    text: str
    #: The envelope's file, where a later ``launch`` reads it.
    path: Path
    hosts: tuple[HostBinary, ...]
    #: The preflight verdicts the builds were planned from.
    verdicts: tuple[Verdict, ...]


def settings_of(c: Context) -> Settings:
    """The ``fdl`` settings ``c``'s configuration holds, checked, to change with
    :func:`attrs.evolve` and hand back; a ``cluster_file`` relative to the project root
    (as invoke.yaml means it) made the path from here."""
    settings = Settings.from_config(c.config.get("fdl", {}))
    project = getattr(c.config, "_project_prefix", None)
    chosen = resolve_cluster_file(settings.cluster_file, False, project)
    return attrs.evolve(settings, cluster_file=chosen)


def options_of(settings: Settings | None) -> dict[str, Any]:
    """``Run.start``'s options: every setting given (checked there again), else none."""
    return attrs.asdict(settings) if settings is not None else {}


def start_build(
    c: Context, command: str, crate_dir: str | None, /, **options: Any
) -> tuple[Run, str]:
    """The run (settings from ``c.config.fdl`` and ``options``, the cluster file read) and
    the crate dir, once ``command`` is known to be one of its binaries."""
    run = Run.start(c, **options)
    return run, crate_of(run, command, crate_dir)


def crate_of(run: Run, command: str, crate_dir: str | None) -> str:
    """The crate dir (option, setting, ``<command>/``, the root) holding ``command``."""
    crate = pipeline.resolve_crate_dir(run, crate_dir, check_command(command))
    check_binary(command, run.root / crate)
    return crate


def recorded_prebuild(run: Run, command: str, crate: str) -> pipeline.Publication | None:
    """The prebuild, its timings page written when ``fdl.timings`` is on."""
    with recorded(run, command) as timed:
        return pipeline.prebuild(timed, command, crate)


def verdict_of(verdict: probe.HostVerdict) -> Verdict:
    return Verdict(**{field.name: getattr(verdict, field.name) for field in attrs.fields(Verdict)})


def published_of(run: Run, published: pipeline.Publication) -> Published:
    """The pipeline's result as the public value (the internal one stays inside)."""
    results = {host: r for r in published.results for host in r.job.hosts}
    verified = set(published.verification.verified) if published.verification else set()
    workers = {w.host: w for w in run.cluster.workers}
    hosts = tuple(
        HostBinary(
            host=host,
            binary=entry.bin,
            sha256=results[host].sha256 if host in results else "",
            rebuilt=host in results and results[host].rebuilt,
            verified=host in verified,
            delivery=workers[host].delivery or run.cluster.delivery,
        )
        for host, entry in sorted(published.entries.items())
    )
    return Published(
        command=published.command,
        text=published.text,
        path=published.path,
        hosts=hosts,
        verdicts=tuple(verdict_of(v) for v in published.verdicts),
    )


def prebuild(
    c: Context, command: str, *, crate_dir: str | None = None, settings: Settings | None = None
) -> Published | None:
    """Preflight, build ``command`` once per build environment, verify, publish: the
    published envelope and each host's binary (``None`` under ``inv --dry``).
    ``settings``: these, not ``c.config.fdl``'s (:func:`settings_of`)."""
    run, crate = start_build(c, command, crate_dir, **options_of(settings))
    published = recorded_prebuild(run, command, crate)
    return published_of(run, published) if published is not None else None


def preflight(c: Context, *, abi: bool = True, settings: Settings | None = None) -> list[Verdict]:
    """Probe every host; each host's verdict (an error on any host raises
    :class:`~fdl_tasks.core.errors.FdlError` after every host was reported; none under
    ``inv --dry``). ``settings``: these, not ``c.config.fdl``'s (:func:`settings_of`)."""
    run = Run.start(c, label="preflight", **options_of(settings))
    return [verdict_of(v) for v in pipeline.preflight(run, abi=abi)]
