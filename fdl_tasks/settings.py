"""The ``fdl`` Invoke config namespace and its typed, validated view.

Defaults live on :class:`Settings`; invoke.yaml, ``INVOKE_FDL_*`` environment
variables, ``ns.configure`` and task options override them in Invoke's usual
order. Empty strings and zeros mean "work it out" so that Invoke can cast
environment variables to each default's type. Values are checked once, by the
one converter, where text from a command line is accepted for numbers and
switches.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any

import attrs

from fdl_tasks.converter import CONVERTER, register_checks, structure
from fdl_tasks.errors import FdlError
from fdl_tasks.values import InvalidValue, quote

#: A positive number of seconds; text (from a command line) is accepted.
Seconds = Annotated[float, "Seconds"]
#: A whole number, 0 or more; text is accepted.
Count = Annotated[int, "Count"]
#: A switch: a boolean, or 1/0, true/false, yes/no as text (Invoke's casting).
Switch = Annotated[bool, "Switch"]
#: A size as sccache writes it: a number with an optional K, M, G or T (powers of 1024).
Size = Annotated[str, "Size"]
_SWITCH_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _number(value: object) -> float | None:
    """A number, or text that is one (Invoke passes untyped options as text)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def check_seconds(value: object) -> Seconds:
    seconds = _number(value)
    if seconds is None or not 0 < seconds < math.inf:
        raise InvalidValue(f"must be a positive number of seconds, got {quote(value)}")
    return seconds


def check_count(value: object) -> Count:
    count = _number(value)
    if count is None or count < 0 or not count.is_integer():
        raise InvalidValue(f"must be int (a whole number, 0 or more), got {quote(value)}")
    return int(count)


def check_switch(value: object) -> Switch:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _SWITCH_WORDS:
        return _SWITCH_WORDS[value.lower()]
    raise InvalidValue(f"must be bool (true or false, yes or no, 1 or 0), got {quote(value)}")


def check_cache_size(value: object) -> Size:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.fullmatch(r"[1-9][0-9]*[KMGT]?", text):
        raise InvalidValue(f"must be a size such as '10G' or '500M', got {quote(value)}")
    return text


def size_bytes(size: Size) -> int:
    """``10G`` → bytes (a checked :data:`Size`)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(size[-1], 1)
    return int(size.rstrip("KMGT")) * scale


register_checks(
    CONVERTER,
    {Seconds: check_seconds, Count: check_count, Switch: check_switch, Size: check_cache_size},
)


@attrs.frozen
class Settings:
    """What the tasks read from ``c.config.fdl``."""

    cluster_file: str = "cluster.yaml"
    controller_host: str = ""
    known_hosts: str = "~/.ssh/known_hosts"
    global_known_hosts: str = "/etc/ssh/ssh_known_hosts"
    ssh_config: str = "~/.ssh/config"
    system_ssh_config: str = "/etc/ssh/ssh_config"
    connect_timeout: Seconds = 5.0
    ssh_window: Count = 32
    probe_timeout: Seconds = 20.0
    build_jobs: Count = 0
    build_timeout: Seconds = 3600.0
    crate_dir: str = ""
    shared_builds: Switch = True
    verify: Switch = True
    compile_cache: Switch = True
    compile_cache_dir: str = "~/.cache/fdl-tasks/sccache"
    compile_cache_size: Size = "10G"
    verify_retries: Count = 3
    verify_retry_delay: Seconds = 1.0
    require_verified: Switch = False
    copy_window: Count = 8
    stale_warning_size: Size = "1G"
    watch_debounce: Seconds = 0.3
    watch_polling: Switch = False
    launch_wait: Seconds = 1800.0
    timings: Switch = False

    @classmethod
    def from_config(cls, fdl: Mapping[str, Any], **options: Any) -> Settings:
        """Merge config with task options (``None`` means the option was not given)."""
        merged = {**dict(fdl), **{k: v for k, v in options.items() if v is not None}}
        unknown = sorted(set(merged) - set(DEFAULTS))
        if unknown:
            raise FdlError(
                f"unknown fdl setting(s): {', '.join(unknown)}; known: " + ", ".join(DEFAULTS)
            )
        return structure(merged, cls, "invalid setting(s)", root="fdl.")

    @property
    def jobs(self) -> int:
        """Concurrent builds: configured, else one per controller core."""
        return self.build_jobs or os.cpu_count() or 1


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
