"""Names the user gives, checked: the command (cargo's ``--bin``), crate dirs, ssh option
keys; and which worker is the controller. Pure."""

from __future__ import annotations

import re

from fdl_tasks.config.model import Cluster, Worker
from fdl_tasks.core.errors import FdlError, passed

#: Environment variable that names the controller's host label.
HOST_NAME_ENV = "FLODL_HOST_NAME"

_SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(?:[ \t]*=[ \t]*|[ \t]+(?!=))(\S.*)")
_COMMAND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_CRATE_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


def split_ssh_option(option: str) -> tuple[str, str] | None:
    """``Key=Value``, ``Key = Value`` or ``Key Value`` → ``("key", "Value")``, as ssh reads it.

    Only the separator is consumed: an ``=`` inside the value is kept. ``None``
    when there is no key or no value.
    """
    match = _SSH_OPTION.fullmatch(option)
    return (match.group(1).lower(), match.group(2)) if match else None


def check_command(name: str) -> str:
    """The command is cargo's ``--bin`` name and a file name on every host."""
    return passed(
        name,
        _COMMAND.fullmatch,
        lambda: FdlError(
            f"command {name!r} is not a valid binary name: use letters, digits, '_' "
            "and '-' (it is passed to cargo as --bin and becomes a file name)"
        ),
    )


def check_crate_dir(relative: str) -> str:
    """The crate directory relative to the project root; ``""`` is the root itself."""
    cleaned = relative.strip("/") if relative not in ("", ".") else ""
    if relative.startswith("/") or (
        cleaned and not all(_CRATE_SEGMENT.fullmatch(s) for s in cleaned.split("/"))
    ):
        raise FdlError(
            f"crate directory {relative!r} must be a relative path inside the project "
            "root, such as 'ddp-bench' (no '..', no absolute path)"
        )
    return cleaned


def controller_label(override: str, env_value: str | None, hostname: str) -> str:
    """The controller's label: task option, else ``FLODL_HOST_NAME``, else the hostname."""
    return override or env_value or hostname


def remote_workers(cluster: Cluster, controller: str) -> tuple[Worker, ...]:
    """Every worker but the controller, compared by label, never by address.

    A container on this machine reached through ``127.0.0.1`` on its own port
    is a distinct host with its own arch, so addresses prove nothing.
    """
    return tuple(w for w in cluster.workers if w.host != controller)


def join_path(root: str, relative: str) -> str:
    """``root`` joined with a relative path that may be empty."""
    base = root.rstrip("/")
    return f"{base}/{relative}" if relative else (base or "/")
