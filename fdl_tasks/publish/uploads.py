"""One file sent to one host over its live connection: SFTP, else the exec channel.

The file goes to a temporary name beside the final path and is renamed into
place (``posix-rename@openssh.com``, an atomic ``rename(2)`` there), so that a
binary running on the host keeps its inode and nothing can exec half a file.
What went wrong is raised as its kind: the host refuses SFTP, the connection
dropped (the caller retries once), or the user stopped the run.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Sequence

import fabric
import paramiko

from fdl_tasks.publish.delivery import (
    HostState,
    Target,
    refused_both,
    stream_problem,
    stream_script,
)
from fdl_tasks.ssh.remote import Fleet

BLOCK = 1 << 20


class Interrupted(Exception):
    """The user stopped the run: uploads end at their next block."""


class NoSftp(Exception):
    """The host refused the SFTP subsystem on a live connection: nothing was written."""


class Dropped(Exception):
    """The connection or its SFTP channel died mid-transfer, perhaps leaving ``part``."""

    def __init__(self, reason: str, part: str | None = None) -> None:
        super().__init__(reason)
        self.part = part


def _transport(connection: fabric.Connection) -> paramiko.Transport:
    """The host's live transport, opened again if it was closed."""
    try:
        if not connection.is_connected:
            connection.open()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise Dropped(_why(exc)) from exc
    transport: paramiko.Transport | None = connection.client.get_transport()
    if transport is None or not transport.is_active():
        raise Dropped("the connection is closed")
    return transport


def _open_sftp(transport: paramiko.Transport, timeout: float) -> paramiko.SFTPClient:
    """An SFTP session; :class:`NoSftp` if the host refuses the subsystem or no SFTP
    server answers on it while the connection stays up (paramiko says "Channel closed.")."""
    try:
        channel = transport.open_session()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise Dropped(_why(exc)) from exc
    channel.settimeout(timeout)
    try:
        channel.invoke_subsystem("sftp")
        return paramiko.SFTPClient(channel)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        channel.close()
        if transport.is_active():
            raise NoSftp from exc
        raise Dropped(_why(exc)) from exc


def upload(
    fleet: Fleet, target: Target, timeout: float, stop: threading.Event, stale: Sequence[str]
) -> None:
    """The temporary file written, made executable, checked for size, renamed into place;
    first, the ``stale`` parts of an attempt whose connection dropped are removed."""
    connection = fleet.connections[target.host]
    sftp = _open_sftp(_transport(connection), timeout)
    part = target.part(secrets.token_hex(6))
    try:
        for leftover in stale:
            _remove_quietly(sftp, leftover)
        with target.source.open("rb") as source, sftp.open(part, "wb") as remote:
            remote.set_pipelined(True)
            for block in iter(lambda: source.read(BLOCK), b""):
                if stop.is_set():
                    raise Interrupted
                remote.write(block)
        written = sftp.stat(part).st_size
        if written != target.size:
            raise OSError(f"{part} holds {written} bytes, {target.size} were sent")
        sftp.chmod(part, 0o755)
        sftp.posix_rename(part, target.final)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        channel = sftp.get_channel()
        transport = connection.client.get_transport()
        dead = channel is None or channel.closed or transport is None or not transport.is_active()
        _remove_quietly(sftp, part)
        if dead or not isinstance(exc, OSError):
            raise Dropped(_why(exc), part) from exc
        raise
    except BaseException:
        _remove_quietly(sftp, part)
        raise
    finally:
        with contextlib.suppress(Exception):  # a dead connection cannot say goodbye
            sftp.close()


def _remove_quietly(sftp: paramiko.SFTPClient, part: str) -> None:
    """Best effort: on a dead connection the next query removes the part instead."""
    with contextlib.suppress(Exception):  # the original failure is the one to report
        sftp.remove(part)


def stream(
    fleet: Fleet,
    target: Target,
    state: HostState,
    timeout: float,
    stop: threading.Event,
    stale: Sequence[str],
) -> str | None:
    """The file on the stdin of :func:`stream_script` over an exec channel; the error.

    A stop or a dropped connection leaves the host a short file, which its checks
    remove; a stop waits for that before it raises.
    """
    transport = _transport(fleet.connections[target.host])
    part = target.part(secrets.token_hex(6))
    try:
        channel = transport.open_session(timeout=timeout)
        channel.exec_command(stream_script(target, part, stale))
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if not transport.is_active():
            raise Dropped(_why(exc)) from exc
        return refused_both(target.host, _why(exc))
    try:
        return _feed(channel, target, state, timeout, stop, part)
    finally:
        channel.close()


def _feed(
    channel: paramiko.Channel,
    target: Target,
    state: HostState,
    timeout: float,
    stop: threading.Event,
    part: str,
) -> str | None:
    """The file's blocks, then end of input; the script's answer as the error, if any."""
    channel.settimeout(timeout)
    try:
        with target.source.open("rb") as source:
            for block in iter(lambda: source.read(BLOCK), b""):
                if stop.is_set():
                    channel.shutdown_write()
                    _exited(channel, timeout)
                    raise Interrupted
                channel.sendall(block)
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if not channel.exit_status_ready():  # else the script ended early: its answer
            raise Dropped(_why(exc), part) from exc
    exited = _exited(channel, timeout)
    if exited is None:
        raise Dropped(f"no answer within {timeout:.0f} s after the last byte", part)
    out, err = _drain(channel.recv), _drain(channel.recv_stderr)
    return stream_problem(target, state, exited, out, err)


def _exited(channel: paramiko.Channel, timeout: float) -> int | None:
    """The script's exit status; ``None`` if the connection died or it did not end in time."""
    if not channel.status_event.wait(timeout):
        return None
    status = channel.recv_exit_status()
    return None if status == -1 else status


def _drain(read: Callable[[int], bytes]) -> str:
    """What the channel holds of one stream (small: the script's answer)."""
    return b"".join(iter(lambda: read(BLOCK), b"")).decode(errors="replace")


def _why(exc: BaseException) -> str:
    """paramiko's own words: a refused channel's text, else the message, else the type."""
    text = exc.text if isinstance(exc, paramiko.ChannelException) else str(exc)
    return text or type(exc).__name__
