"""What a command sent to one host came to: a reply, or a failure said in one line."""

from __future__ import annotations

import socket

import attrs
import paramiko
from invoke.exceptions import CommandTimedOut

from fdl_tasks.hostkey_policy import HostKeyRefused
from fdl_tasks.model import Worker


@attrs.frozen
class Reply:
    """A command that ran; its exit code may still be non-zero."""

    stdout: str
    stderr: str
    exited: int


@attrs.frozen
class Failure:
    """A command that never ran to the end on that host, and why in one line."""

    reason: str
    #: The host's key was refused: changed, ``@revoked``, or unknown where
    #: ``StrictHostKeyChecking`` is ``yes``. An error, never "unreachable".
    host_key_refused: bool = False


Outcome = Reply | Failure


def describe_failure(exc: BaseException, worker: Worker, connect_timeout: float) -> Failure:
    """One readable line for anything a connection or command can raise.

    ``connect_timeout`` is the host's own budget for connect, banner and auth.
    """
    where = f"{worker.ssh_target}:{worker.ssh.port or 22}"
    if isinstance(exc, HostKeyRefused):
        return Failure(exc.reason, host_key_refused=True)
    if isinstance(exc, paramiko.BadHostKeyException):
        return Failure(
            f"host key of {where} does not match the one remembered: it may be a man in "
            "the middle; if the host was reinstalled, remove the old key with ssh-keygen -R",
            host_key_refused=True,
        )
    if isinstance(exc, CommandTimedOut):
        return Failure(f"no answer within {exc.timeout:g}s (command timed out)")
    if isinstance(exc, paramiko.AuthenticationException):
        return Failure(f"authentication failed at {where}")
    if isinstance(exc, socket.gaierror):
        return Failure(f"cannot resolve {worker.ssh_target}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | ConnectionError):
        return Failure(f"connection refused at {where}")
    if isinstance(exc, TimeoutError | socket.timeout):
        return Failure(f"connection to {where} timed out after {connect_timeout:g}s")
    if isinstance(exc, paramiko.SSHException) and (
        "banner" in str(exc) or "No existing session" in str(exc)
    ):
        return Failure(
            f"{where} accepted the connection but no SSH session was established "
            f"within {connect_timeout:g}s (no SSH banner: hung host?)"
        )
    return Failure(f"{type(exc).__name__} at {where}: {exc}".strip())
