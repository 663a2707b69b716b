"""The functions another project's tasks may call: typed, returning what they did.

``prebuild`` and ``preflight`` are what the Invoke tasks of the same names
run, minus the command line: options as keyword arguments (any ``fdl``
setting, as :class:`~fdl_tasks.config.settings.Settings` names it), an
:class:`~fdl_tasks.core.errors.FdlError` when something is wrong (the tasks turn it
into a message and exit 1; 4 for ``LoginRefused``, 5 for ``NothingVerified``), and
a value back.
"""

from __future__ import annotations

from typing import Any

from invoke.context import Context

import fdl_tasks.publish.pipeline as pipeline
from fdl_tasks.cargo.binaries import check_binary
from fdl_tasks.config.names import check_command
from fdl_tasks.config.run import Run
from fdl_tasks.preflight.probe import Verdict
from fdl_tasks.publish.envelope import hand_over
from fdl_tasks.publish.pipeline import Published
from fdl_tasks.timings.recording import recorded

__all__ = ["Published", "Verdict", "prebuild", "preflight"]


def start_build(
    c: Context, command: str, crate_dir: str | None, **settings: Any
) -> tuple[Run, str]:
    """The run (settings from ``c.config.fdl`` and ``settings``, the cluster file read) and
    the crate dir, once ``command`` is known to be one of its binaries."""
    run = Run.start(c, **settings)
    return run, crate_of(run, command, crate_dir)


def crate_of(run: Run, command: str, crate_dir: str | None) -> str:
    """The crate dir (option, setting, ``<command>/``, the root) holding ``command``."""
    crate = pipeline.resolve_crate_dir(run, crate_dir, check_command(command))
    check_binary(command, run.root / crate)
    return crate


def publish_in_process(run: Run, command: str, crate: str) -> Published | None:
    """The prebuild (its timings page written when ``fdl.timings`` is on); its envelope
    handed to a launch later in this process."""
    hand_over(None)
    with recorded(run, command) as timed:
        published = pipeline.prebuild(timed, command, crate)
    if published is not None:
        hand_over(published.text)
    return published


def prebuild(
    c: Context, command: str, *, crate_dir: str | None = None, **settings: Any
) -> Published | None:
    """Preflight, build ``command`` once per build environment, verify, publish: the
    published envelope and what was verified (``None`` under ``inv --dry``)."""
    run, crate = start_build(c, command, crate_dir, **settings)
    return publish_in_process(run, command, crate)


def preflight(c: Context, *, abi: bool = True, **settings: Any) -> list[Verdict]:
    """Probe every host; each host's verdict (an error on any host raises
    :class:`~fdl_tasks.core.errors.FdlError` after every host was reported)."""
    return pipeline.preflight(Run.start(c, label="preflight", **settings), abi=abi)
