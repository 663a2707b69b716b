"""The ``fdl`` Invoke config namespace and its typed, validated view.

Defaults live here; invoke.yaml, ``INVOKE_FDL_*`` environment variables,
``ns.configure`` and task options override them in Invoke's usual order.
Empty strings and zeros mean "work it out" so that Invoke can cast
environment variables to each default's type.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from fdl_tasks.errors import FdlError

DEFAULTS: dict[str, Any] = {
    "cluster_file": "cluster.yaml",
    "controller_host": "",
    "known_hosts": "~/.ssh/known_hosts",
    "ssh_config": "~/.ssh/config",
    "system_ssh_config": "/etc/ssh/ssh_config",
    "connect_timeout": 5.0,
    "probe_timeout": 20.0,
    "build_jobs": 0,
    "build_timeout": 3600.0,
    "crate_dir": "",
    "shared_builds": True,
    "verify": True,
    "verify_retries": 3,
    "verify_retry_delay": 1.0,
    "envelope_file": "target/cluster/_envelope.json",
}


@attrs.frozen
class Settings:
    """What the tasks read from ``c.config.fdl``, checked once at the edge."""

    cluster_file: str
    controller_host: str
    known_hosts: str
    ssh_config: str
    system_ssh_config: str
    connect_timeout: float
    probe_timeout: float
    build_jobs: int
    build_timeout: float
    crate_dir: str
    shared_builds: bool
    verify: bool
    verify_retries: int
    verify_retry_delay: float
    envelope_file: str

    @classmethod
    def from_config(cls, fdl: Mapping[str, Any], **options: Any) -> Settings:
        """Merge config with task options (``None`` means the option was not given)."""
        merged = {**DEFAULTS, **dict(fdl), **{k: v for k, v in options.items() if v is not None}}
        unknown = sorted(set(merged) - set(DEFAULTS))
        if unknown:
            raise FdlError(
                f"unknown fdl setting(s): {', '.join(unknown)}; known: " + ", ".join(DEFAULTS)
            )
        values: dict[str, Any] = {}
        for name, default in DEFAULTS.items():
            values[name] = _coerce(name, merged[name], type(default))
        for name in ("connect_timeout", "probe_timeout", "build_timeout"):
            if values[name] <= 0:
                raise FdlError(f"fdl.{name} must be a positive number of seconds")
        if values["build_jobs"] < 0 or values["verify_retries"] < 0:
            raise FdlError("fdl.build_jobs and fdl.verify_retries must not be negative")
        return cls(**values)

    @property
    def jobs(self) -> int:
        """Concurrent builds: configured, else one per controller core."""
        return self.build_jobs or os.cpu_count() or 1


def _coerce(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
            return value.lower() in ("1", "true", "yes")
    elif kind is float and isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    elif kind is int and not isinstance(value, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            pass
    elif isinstance(value, kind):
        return value
    raise FdlError(f"fdl.{name} must be {kind.__name__}, got {value!r}")
