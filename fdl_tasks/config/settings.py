"""The ``fdl`` Invoke config namespace and its typed, validated view.

Defaults live on :class:`Settings`; invoke.yaml, ``INVOKE_FDL_*`` environment
variables, ``ns.configure`` and task options override them in Invoke's usual
order. Empty strings and zeros mean "work it out" so that Invoke can cast
environment variables to each default's type. Values are checked once, by the
one converter, where text from a command line is accepted for numbers and
switches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from fdl_tasks.config.converter import structure
from fdl_tasks.config.setting_values import (
    Count,
    Gateways,
    Launcher,
    LoginErrors,
    NcclMismatch,
    Requirement,
    Seconds,
    Size,
    Switch,
)
from fdl_tasks.core.errors import FdlError


@attrs.frozen
class Settings:
    """What the tasks read from ``c.config.fdl``."""

    #: Empty: ``cluster.yaml`` in the project root, else the flodl project's ``fdl.yml`` layers.
    cluster_file: str = ""
    #: The flodl env whose overlay holds the cluster block (empty: ``$FDL_ENV``, else cluster).
    env: str = ""
    launcher: Launcher = "auto"
    controller_host: str = ""
    known_hosts: str = "~/.ssh/known_hosts"
    global_known_hosts: str = "/etc/ssh/ssh_known_hosts"
    ssh_config: str = "~/.ssh/config"
    system_ssh_config: str = "/etc/ssh/ssh_config"
    connect_timeout: Seconds = 5.0
    ssh_window: Count = 32
    ssh_sessions: Count = 128
    probe_timeout: Seconds = 20.0
    #: Hosts asked through ClusterShell gateways (preflight, verification); empty: none.
    gateways: Gateways = attrs.field(factory=dict)
    build_jobs: Count = 0
    build_timeout: Seconds = 3600.0
    crate_dir: str = ""
    shared_builds: Switch = True
    verify: Switch = True
    compile_cache: Switch = True
    skip_unchanged: Switch = True
    #: Builds ``docker exec``'d in a long-lived container per build environment.
    warm_containers: Switch = True
    #: Seconds a warm build container waits for its next build before it stops itself.
    warm_idle: Seconds = 1800.0
    compile_cache_dir: str = "~/.cache/fdl-tasks/sccache"
    compile_cache_size: Size = "10G"
    verify_retries: Count = 3
    verify_retry_delay: Seconds = 1.0
    require_verified: Requirement = "one"
    ssh_login_errors: LoginErrors = "error"
    nccl_mismatch: NcclMismatch = "warn"
    copy_window: Count = 8
    stale_warning_size: Size = "1G"
    watch_debounce: Seconds = 0.3
    watch_polling: Switch = False
    launch_wait: Seconds = 1800.0
    timings: Switch = False
    #: Every note, also those said already on an earlier run (``-v``).
    verbose: Switch = False
    #: Plain lines even on a terminal: no live region (``--plain``; a pipe is always plain).
    plain: Switch = False

    @classmethod
    def from_config(cls, fdl: Mapping[str, Any], **options: Any) -> Settings:
        """Merge config with task options (``None`` means the option was not given)."""
        merged = {**dict(fdl), **{k: v for k, v in options.items() if v is not None}}
        if unknown := sorted(set(merged) - set(DEFAULTS)):
            raise FdlError(
                f"unknown fdl setting(s): {', '.join(unknown)}; known: " + ", ".join(DEFAULTS)
            )
        return structure(merged, cls, "invalid setting(s)", root="fdl.")


def resolve_cluster_file(chosen: str, given: bool, project_dir: str | None) -> str:
    """The cluster file to read (empty: to be found). One named on the command line
    (``given``) is relative to the working directory, as the shell completed it; one from
    the settings (invoke.yaml, ``INVOKE_FDL_CLUSTER_FILE``) to the project root, where
    Invoke found ``tasks.py`` (``project_dir``; ``None`` outside ``inv``), so that a
    subdirectory works as it does for cargo."""
    if not chosen or given or project_dir is None or os.path.isabs(chosen):
        return chosen
    return os.path.join(project_dir, chosen)


#: The ``fdl`` namespace's defaults, for ``ns.configure``.
DEFAULTS: dict[str, Any] = attrs.asdict(Settings())


def namespace_defaults() -> dict[str, Any]:
    """The defaults for ``ns.configure``, numbers as text.

    Invoke casts an ``INVOKE_FDL_*`` variable to its default's type itself, and
    ``int("x")`` would be a traceback inside Invoke; as text, the value reaches
    :meth:`Settings.from_config`, whose checks say what is wrong in one line.
    """
    return {
        name: str(value)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else value
        for name, value in DEFAULTS.items()
    }
