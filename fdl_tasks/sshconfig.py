"""ssh_config for each worker: its ``ssh.options`` first, then the user's and the system's files.

Placed before ``~/.ssh/config`` and ``/etc/ssh/ssh_config``, a worker's own
options win, exactly as OpenSSH applies them (first value wins); options
paramiko cannot honour are named, never silently dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Worker
from fdl_tasks.rules import split_ssh_option

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
