"""What the Fleet knows of each login: the identity loaded once, the keys a connection
offers, and, once a handshake failed, what its port says to an SSH greeting.

The I/O side of :mod:`fdl_tasks.ssh.ssh_failures`, which says what a failure is.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

import attrs
import fabric
import paramiko

from fdl_tasks.ssh.ssh_failures import Login


class _NoHandshakeTracebacks(logging.Filter):
    """Drops paramiko's transport warnings and errors (a failed handshake's traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


def quiet_paramiko() -> None:
    """The Fleet reports a failed handshake as one line: the filter, once per process on
    ``paramiko.transport``; the host application's ``paramiko`` logger left as it is."""
    logger = logging.getLogger("paramiko.transport")
    if not any(isinstance(f, _NoHandshakeTracebacks) for f in logger.filters):
        logger.addFilter(_NoHandshakeTracebacks())


#: The keys paramiko looks for when it may (``look_for_keys``), as OpenSSH's defaults.
DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")
#: What the Fleet says first to a port that closed a handshake without a banner.
GREETING = b"SSH-2.0-fdl_tasks_check\r\n"


@attrs.frozen
class Identity:
    """One identity file as read: its key, or why it cannot be used."""

    #: The key, loaded once per fan-out; ``None`` if paramiko must load it itself
    #: (a passphrase: the agent may hold it) or it cannot be used.
    pkey: paramiko.PKey | None
    #: Why it cannot be used ("" if it can): ``missing``, ``public`` (a ``.pub``
    #: file, or text that starts like one) or ``unreadable`` (no private key).
    why: str = ""

    @property
    def unusable(self) -> bool:
        return bool(self.why)


def load_identity(path: str) -> Identity:
    if not os.path.isfile(path):
        return Identity(None, "missing")
    try:
        return Identity(paramiko.PKey.from_path(path))
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: a passphrase
        return Identity(None)
    except (paramiko.SSHException, ValueError, OSError):
        try:
            with open(path, "rb") as stream:
                head = stream.read(64)
        except OSError:
            head = b""
        public = path.endswith(".pub") or head.startswith((b"ssh-", b"ecdsa-", b"sk-"))
        return Identity(None, "public" if public else "unreadable")


def login_of(
    connection: fabric.Connection, environ: Mapping[str, str] = os.environ, answer: str = ""
) -> Login:
    """Who a connection logs in as, and the keys it offers, in paramiko's order."""
    kwargs: dict[str, Any] = connection.connect_kwargs
    files = kwargs.get("key_filename") or []
    keys = [os.path.expanduser(f) for f in ([files] if isinstance(files, str) else files)]
    if kwargs.get("look_for_keys", True):
        keys += [p for p in map(os.path.expanduser, DEFAULT_KEYS) if os.path.isfile(p)]
    agent = bool(kwargs.get("allow_agent", True) and environ.get("SSH_AUTH_SOCK"))
    return Login(
        user=connection.user,
        host=connection.host,
        port=connection.port,
        keys=tuple(dict.fromkeys(keys)),
        agent=agent,
        identity_only=kwargs.get("look_for_keys") is False and bool(keys),
        answer=answer,
        via=_via(connection.gateway),
    )


def _via(gateway: object) -> tuple[str, ...]:
    """ssh's options for the way there: ``-J`` with the hops, first first; a ProxyCommand."""
    if isinstance(gateway, str):
        return ("-o", f"ProxyCommand={gateway}")
    hops: list[str] = []
    while isinstance(gateway, fabric.Connection):
        hops.insert(0, f"{gateway.user}@{gateway.host}:{gateway.port}")
        gateway = gateway.gateway
    return ("-J", ",".join(hops)) if hops else ()


def greet(host: str, port: int, timeout: float) -> str:
    """The first line a port answers to an SSH greeting ("" if none, or it cannot be reached)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(GREETING)
            data = sock.recv(256)
    except OSError:
        return ""
    return data.decode("utf-8", "replace").splitlines()[0].strip() if data.strip() else ""
