"""The kinds of value of the ``fdl`` settings, and their checks.

Text is accepted for numbers and switches: Invoke passes untyped options and
``INVOKE_FDL_*`` variables as text. Pure; the converter registers the checks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from fdl_tasks.config.values import InvalidValue, quote

#: A positive number of seconds; text (from a command line) is accepted.
Seconds = Annotated[float, "Seconds"]
#: A whole number, 0 or more; text is accepted.
Count = Annotated[int, "Count"]
#: A switch: a boolean, or 1/0, true/false, yes/no as text (Invoke's casting).
Switch = Annotated[bool, "Switch"]
#: A size as sccache writes it: a number with an optional K, M, G or T (powers of 1024).
Size = Annotated[str, "Size"]
#: ``fdl.require_verified``: how many remote hosts verification must reach (``all``,
#: ``one`` or ``none``; a switch's words: on is ``all``, off is ``none``).
Requirement = Annotated[str, "Requirement"]
#: ``fdl.ssh_login_errors``: a misconfigured ssh login is an ``error``, or (flodl) a ``warn``.
LoginErrors = Annotated[str, "LoginErrors"]
#: ``fdl.nccl_mismatch``: hosts disagreeing on NCCL major.minor are a ``warn`` or an ``error``.
NcclMismatch = Annotated[str, "NcclMismatch"]
#: ``fdl.launcher``: ``fdl`` (flodl's own launcher), ``direct`` (each binary alone) or ``auto``.
Launcher = Annotated[str, "Launcher"]
#: ``fdl.gateways``: gateways (a name, or a ClusterShell node set of gateways that share
#: the hosts) to the worker labels each serves (a list, or one node set such as ``n[01-40]``).
Gateways = Annotated[dict[str, tuple[str, ...]], "Gateways"]
#: What ``fdl.launcher: auto`` and ``--launcher`` choose among.
LAUNCHERS = ("auto", "fdl", "direct")
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


def check_requirement(value: object) -> Requirement:
    if isinstance(value, str) and value.lower() in ("all", "one", "none"):
        return value.lower()
    try:
        return "all" if check_switch(value) else "none"
    except InvalidValue:
        raise InvalidValue(
            f"must be all, one or none (true is all, false is none), got {quote(value)}"
        ) from None


def one_of(*words: str) -> Callable[[object], str]:
    """The check of a setting that is one of ``words``, in any case."""
    said = f"{', '.join(words[:-1])} or {words[-1]}"

    def check(value: object) -> str:
        if isinstance(value, str) and value.lower() in words:
            return value.lower()
        raise InvalidValue(f"must be {said}, got {quote(value)}")

    return check


def check_cache_size(value: object) -> Size:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.fullmatch(r"[1-9][0-9]*[KMGT]?", text):
        raise InvalidValue(f"must be a size such as '10G' or '500M', got {quote(value)}")
    return text


def check_gateways(value: object) -> Gateways:
    """The shape only; names are expanded and held against the cluster by the fan-out.

    A mapping from invoke.yaml arrives as Invoke's ``DataProxy``: anything with items."""
    items = getattr(value, "items", None)
    if not callable(items):
        raise InvalidValue(
            f"must be a mapping of gateway to the worker labels it serves, got {quote(value)}"
        )
    routes: Gateways = {}
    for gateway, served in items():
        labels = [served] if isinstance(served, str) else served
        if not isinstance(gateway, str) or not gateway.strip():
            raise InvalidValue(f"has a gateway that is not a name: {quote(gateway)}")
        if not isinstance(labels, list | tuple) or not labels:
            raise InvalidValue(f"{gateway}: must name the worker labels it serves")
        if not all(isinstance(x, str) and x.strip() for x in labels):
            raise InvalidValue(f"{gateway}: {quote(served)} is not a list of worker labels")
        routes[gateway.strip()] = tuple(x.strip() for x in labels)
    return routes


def size_bytes(size: Size) -> int:
    """``10G`` → bytes (a checked :data:`Size`)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(size[-1], 1)
    return int(size.rstrip("KMGT")) * scale


#: The check of each kind of setting, for the converter.
SETTING_CHECKS: dict[Any, Callable[[object], object]] = {
    Seconds: check_seconds,
    Count: check_count,
    Switch: check_switch,
    Size: check_cache_size,
    Requirement: check_requirement,
    LoginErrors: one_of("error", "warn"),
    NcclMismatch: one_of("error", "warn"),
    Launcher: one_of(*LAUNCHERS),
    Gateways: check_gateways,
}
