"""``controller.dist``: its values checked as the cluster file is read.

The converter applies :data:`DIST_CHECKS` to each value and the loader
:func:`check_dist` to the block; what sccache-dist itself is asked and told is
:mod:`fdl_tasks.cache.dist`'s.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from fdl_tasks.config.model import ControllerFile, DistSettings, SchedulerUrl
from fdl_tasks.config.values import InvalidValue, check_text, quote

_SCHEMES = ("http", "https")


#: Characters a URL written into TOML and into sccache's HTTP client never needs.
_URL_BAD = re.compile(r"[\s\"'\\<>`{}|^]")


def check_scheduler_url(value: object) -> SchedulerUrl:
    """``http(s)://host[:port][/path]``; never a user or password (it would be printed)."""
    text = check_text(value)
    rule = (
        "must be the scheduler's URL such as 'http://10.0.0.5:10600' or "
        "'https://sccache.example.org' (http or https, a host, an optional port)"
    )
    try:
        parts = urllib.parse.urlsplit(text)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    if parts is not None and "@" in parts.netloc:
        # The value is not quoted: it holds a password or a token.
        raise InvalidValue(
            "the scheduler URL must not carry a user or a password: put the client "
            "token in controller.dist.token_file or token_env"
        )
    if (
        parts is None
        or not port_ok
        or parts.scheme not in _SCHEMES
        or not parts.hostname
        or parts.query
        or parts.fragment
        or _URL_BAD.search(text)
    ):
        raise InvalidValue(f"scheduler URL {quote(text)} {rule}")
    return text


def check_controller_file(value: object) -> ControllerFile:
    """A file on the controller: absolute, or under the invoking user's home (``~/``)."""
    text = check_text(value)
    if not (text.startswith("/") or text.startswith("~/")) or text.endswith("/"):
        raise InvalidValue(
            f"expected a file on the controller: an absolute path or one starting "
            f"with '~/' (e.g. '~/.config/sccache/dist.token'), got {quote(text)}"
        )
    return text


#: The check of each kind of ``controller.dist`` value, for the converter.
DIST_CHECKS: dict[Any, Callable[[object], object]] = {
    SchedulerUrl: check_scheduler_url,
    ControllerFile: check_controller_file,
}


def check_dist(dist: DistSettings) -> str | None:
    """The cross-field rule of ``controller.dist`` (exactly one token source), as
    ``<key>: <problem>`` under ``controller.dist``, or ``None`` when it holds."""
    if dist.token_file and dist.token_env:
        return "set token_file or token_env, not both"
    if not dist.token_file and not dist.token_env:
        return (
            "the client token is missing: set token_file (a file on the controller "
            "holding the token) or token_env (the name of a variable holding it)"
        )
    return None
