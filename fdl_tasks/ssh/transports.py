"""How the Fleet's connections behave: prompt on the wire, quiet while idle, woken when
closed.

paramiko gives every connection a thread of its own; these keep those threads
asleep while there is nothing to read, so that thousands of open connections
cost no CPU, and make Invoke's runner wait on the command's exit, not a timer.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import fabric
import paramiko
from fabric.runners import Remote


class AckingSocket(socket.socket):
    """A TCP socket that acknowledges what it received before each read (Linux's
    ``TCP_QUICKACK``) instead of holding the acknowledgement back for a reply to carry.

    sshd leaves Nagle's algorithm on for a command without a terminal, so a small
    message it sends behind another waits until the first is acknowledged. Right
    after a login it sends two (the login's success, then its host keys,
    ``hostkeys-00@openssh.com``, which wants no reply): the confirmation of the
    connection's first channel waited behind the second until Linux's delayed
    acknowledgement went out, 40 ms later. Measured on the rig's sshd, a fresh
    login's first command (a preflight's probe), three hosts at once: 52 ms → 10 ms
    (``python3 -m bench.login``).
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv(bufsize, flags)


def prompt_transport(sock: Any, **options: Any) -> paramiko.Transport:
    """paramiko's transport over a TCP socket made prompt both ways: Nagle's algorithm
    off (``TCP_NODELAY``: paramiko leaves it on), and what the host sends acknowledged
    at once where Linux allows it (:class:`AckingSocket`). A login, and every command,
    sends small messages two in a row; with Nagle's algorithm the second waits for the
    host's acknowledgement of the first, which the host delays by up to 40 ms. Measured
    on the rig's loopback sshd: a login 65 ms → 23 ms, a command's round trip 49 ms →
    5 ms (docs/numbers.md). A jump host's channel (the socket of a login through it) is
    not a socket: left as it is."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_QUICKACK"):  # Linux only
            timeout = sock.gettimeout()
            sock = AckingSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
            sock.settimeout(timeout)
    return paramiko.Transport(sock, **options)


class FleetRemote(Remote):  # type: ignore[misc]
    """Fabric's runner, woken by the channel's exit status instead of polling.

    ``Runner.wait`` sleeps ``input_sleep`` between checks, in every group
    thread at once: at hundreds of hosts the 10 ms default is GIL churn, and a
    longer sleep adds its length to every round trip. Waiting on paramiko's
    ``status_event`` ends the wait as soon as the command has exited; the
    50 ms bound still notices dead reader threads.
    """

    input_sleep = 0.05

    def wait(self) -> None:
        while not (self.process_is_finished or self.has_dead_threads):
            self.channel.status_event.wait(self.input_sleep)


#: How often an open connection's paramiko thread wakes to look for a close (paramiko: 0.1 s).
IDLE_POLL = 30.0


def settle(connection: fabric.Connection) -> None:
    """Let an open connection's paramiko thread sleep until the host sends something.

    paramiko's transport thread reads with a 0.1 s timeout, so each open
    connection wakes ten times a second to see whether it was closed: at
    thousands of hosts, that polling took most of the controller's CPU and
    grew with the run's length. Once the handshake is done, nothing needs it;
    :func:`hang_up` wakes the thread at once when the connection is closed.
    """
    while isinstance(connection, fabric.Connection):
        transport = connection.client.get_transport()
        if transport is not None and isinstance(transport.sock, socket.socket):
            transport.sock.settimeout(IDLE_POLL)
        connection = connection.gateway


def hang_up(connection: fabric.Connection) -> None:
    """Close a connection and its jump hosts, waking their paramiko threads (asleep in
    ``recv``) at once."""
    while isinstance(connection, fabric.Connection):
        transport = connection.client.get_transport()
        if transport is not None and isinstance(transport.sock, socket.socket):
            with contextlib.suppress(OSError):
                transport.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        connection = connection.gateway
