"""ssh_config for each worker: its ``ssh.options`` first, then the user's and the system's files.

Placed before ``~/.ssh/config`` and ``/etc/ssh/ssh_config``, a worker's own
options win, exactly as OpenSSH applies them (first value wins); options
paramiko cannot honour are named, never silently dropped. The host-key
options (``StrictHostKeyChecking``, ``UserKnownHostsFile``,
``GlobalKnownHostsFile``, ``HashKnownHosts``) are read here for each host
(:func:`host_key_options`) and carried out by :mod:`fdl_tasks.ssh.known_hosts_io`.
"""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.names import split_ssh_option
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.ssh.hostkey_policy import DEFAULT_STRICT, STRICT_WORDS

#: ssh_config keys (lower case) that Fabric and paramiko honour.
HONOURED_OPTIONS = frozenset(
    {
        "hostname",
        "port",
        "user",
        "identityfile",
        "proxyjump",
        "proxycommand",
        "connecttimeout",
        "forwardagent",
        "stricthostkeychecking",
        "userknownhostsfile",
        "globalknownhostsfile",
        "hashknownhosts",
    }
)


def ssh_config_block(worker: Worker) -> tuple[str, list[str]]:
    """The worker's options as an ssh_config ``Host *`` block, and the keys we cannot honour.

    The identity file goes into the block too, so ProxyJump hops use it as well.
    """
    lines, ignored = ["Host *"], []
    if worker.ssh.identity_file:
        lines.append(f"    identityfile = {worker.ssh.identity_file}")
    for option in worker.ssh.options:
        key, value = split_ssh_option(option) or ("", "")
        if key in HONOURED_OPTIONS:
            lines.append(f"    {key} = {value}")  # "=" keeps a value's own leading "="
        else:
            ignored.append(option[: len(key)])
    return "\n".join(lines) + "\n", ignored


def connect_budget(label: str, host: str, config: Mapping[str, Any], settings: Settings) -> float:
    """A hop's ``ConnectTimeout`` if its ssh_config (``config``) has one, else the setting."""
    value = config.get("connecttimeout")
    if value is None:
        return settings.connect_timeout
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise FdlError(
            f"{label}: ConnectTimeout {value!r} (for {host}) must be a positive number of seconds"
        )
    return seconds


def read_config(path: str) -> str:
    """An ssh_config file's text ('' if absent); read once per fan-out, not per host."""
    if not path:
        return ""
    try:
        return "\n" + Path(os.path.expanduser(path)).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise FdlError(f"cannot read the ssh config {path}: {exc}") from None


@attrs.frozen
class HostKeyOptions:
    """How one host's key is checked: OpenSSH's host-key options, resolved for that host."""

    #: ``yes`` or ``accept-new`` (see :data:`fdl_tasks.ssh.hostkey_policy.STRICT_WORDS`).
    strict: str
    #: ``StrictHostKeyChecking`` as the configuration spells it ("" if unset).
    said: str
    #: Known-hosts files, absolute: new keys go to the first user file.
    user_files: tuple[str, ...]
    global_files: tuple[str, ...]
    #: ``HashKnownHosts yes``: new names are written hashed.
    hashed: bool


def host_key_options(
    label: str,
    config: Mapping[str, Any],
    tokens: Mapping[str, str],
    known_hosts: str,
    global_known_hosts: str,
) -> HostKeyOptions:
    """One host's host-key options from its ssh_config lookup; unset ones from the settings.

    ``known_hosts`` (one file) and ``global_known_hosts`` (files separated by
    spaces, like ``GlobalKnownHostsFile``) are the defaults; "" or ``none``
    means no file. ``tokens`` expand ``%h``, ``%p``, ``%r``, ``%n`` in the
    files named by ssh_config, as OpenSSH does.
    """
    said = str(config.get("stricthostkeychecking") or "")
    strict = STRICT_WORDS.get(said.lower()) if said else DEFAULT_STRICT
    if strict is None:
        raise FdlError(
            f"{label}: StrictHostKeyChecking {said!r} is not one of " + ", ".join(STRICT_WORDS)
        )
    if "userknownhostsfile" in config:
        user = _files(label, "UserKnownHostsFile", config["userknownhostsfile"], tokens)
    else:
        user = tuple(_expand(p) for p in [known_hosts] if p.strip() and p.strip() != "none")
    if "globalknownhostsfile" in config:
        global_ = _files(label, "GlobalKnownHostsFile", config["globalknownhostsfile"], tokens)
    else:
        global_ = _files(label, "fdl.global_known_hosts", global_known_hosts, None)
    hashed = str(config.get("hashknownhosts", "no")).lower() in ("yes", "true")
    return HostKeyOptions(strict, said, user, global_, hashed)


def _files(
    label: str, option: str, value: str, tokens: Mapping[str, str] | None
) -> tuple[str, ...]:
    """A list of files as ssh_config writes it: quoted words, ``~`` (and, with ``tokens``,
    ``%`` tokens) expanded; ``none`` is no file."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise FdlError(f"{label}: {option} {value!r}: {exc}") from None
    if words == ["none"]:
        return ()
    if tokens is None:
        return tuple(_expand(word) for word in words)
    return tuple(_expand(_tokens(label, option, word, tokens)) for word in words)


def _tokens(label: str, option: str, word: str, tokens: Mapping[str, str]) -> str:
    known = {"%": "%", "d": os.path.expanduser("~"), "u": getpass.getuser(), **tokens}
    out, rest = [], word
    while "%" in rest:
        before, _, rest = rest.partition("%")
        token, rest = rest[:1], rest[1:]
        if token not in known:
            raise FdlError(
                f"{label}: {option} {word!r}: %{token} is not supported here "
                f"(only %{', %'.join(sorted(known))})"
            )
        out += [before, known[token]]
    return "".join([*out, rest])


def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path.strip()))
