"""How the Fleet's connections behave once open: quiet while idle, woken when closed.

paramiko gives every connection a thread of its own; these keep those threads
asleep while there is nothing to read, so that thousands of open connections
cost no CPU, and make Invoke's runner wait on the command's exit, not a timer.
"""

from __future__ import annotations

import contextlib
import socket

import fabric
from fabric.runners import Remote


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
