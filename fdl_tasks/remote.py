"""Fabric connections to the workers: one per host, kept open for a whole task.

Host keys are trusted on first use and remembered, like OpenSSH's
``StrictHostKeyChecking=accept-new``; a changed key is always an error.
Each worker's ``ssh.options`` become an ssh_config block placed before the
user's own ``~/.ssh/config`` and the system's ``/etc/ssh/ssh_config``, so
Fabric applies them exactly as OpenSSH would (first value wins).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import fabric
import paramiko
from fabric.exceptions import GroupException
from invoke.exceptions import CommandTimedOut

from fdl_tasks.console import TextSink
from fdl_tasks.errors import FdlError
from fdl_tasks.model import Worker
from fdl_tasks.rules import split_ssh_option
from fdl_tasks.settings import Settings

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
    host_key_changed: bool = False


Outcome = Reply | Failure


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept and remember an unknown host key; paramiko itself rejects a changed one.

    Appends under a lock so that concurrent first connections from one
    ThreadingGroup do not overwrite each other's entries.
    """

    _lock = threading.Lock()

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        with self._lock:
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a", encoding="utf-8") as stream:
                stream.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def quiet_paramiko() -> None:
    """Paramiko logs tracebacks for every failed handshake; we report one line instead."""
    logger = logging.getLogger("paramiko")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


def describe_failure(exc: BaseException, settings: Settings, worker: Worker) -> Failure:
    """One readable line for anything a connection or command can raise."""
    where = f"{worker.ssh_target}:{worker.ssh.port or 22}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return Failure(
            f"host key of {where} does not match the one remembered in {settings.known_hosts}: "
            "it may be a man in the middle; if the host was reinstalled, remove the old key "
            "with ssh-keygen -R",
            host_key_changed=True,
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
        return Failure(f"connection to {where} timed out after {settings.connect_timeout:g}s")
    if isinstance(exc, paramiko.SSHException) and (
        "banner" in str(exc) or "No existing session" in str(exc)
    ):
        return Failure(
            f"{where} accepted the connection but no SSH session was established "
            f"within {settings.connect_timeout:g}s (no SSH banner: hung host?)"
        )
    return Failure(f"{type(exc).__name__} at {where}: {exc}".strip())


def _read_config(path: str) -> str:
    """An ssh_config file's text ('' if absent); read once per fan-out, not per host."""
    if not path:
        return ""
    try:
        return "\n" + Path(os.path.expanduser(path)).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise FdlError(f"cannot read the ssh config {path}: {exc}") from None


class Fleet:
    """Open Fabric connections to some workers; commands fan out in ThreadingGroups.

    Hosts that get the same command share one group, and groups run
    concurrently, so a whole fan-out costs one round trip of the slowest host.
    """

    def __init__(
        self, workers: Iterable[Worker], settings: Settings, report: Callable[[str], None]
    ) -> None:
        quiet_paramiko()
        self.settings = settings
        self.workers: dict[str, Worker] = {w.host: w for w in workers}
        self._config_files = "".join(
            _read_config(path) for path in (settings.ssh_config, settings.system_ssh_config)
        )
        self.connections: dict[str, fabric.Connection] = {
            label: self._connect(w, report) for label, w in self.workers.items()
        }

    def _connect(self, worker: Worker, report: Callable[[str], None]) -> fabric.Connection:
        block, ignored = ssh_config_block(worker)
        for key in ignored:
            report(
                f"{worker.host}: ssh option {key} is not supported by Fabric/paramiko "
                "and is ignored"
            )
        ssh_config = paramiko.SSHConfig.from_text(block + self._config_files)
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.settings.connect_timeout,
            "auth_timeout": self.settings.connect_timeout,
            "channel_timeout": self.settings.connect_timeout,
        }
        if worker.ssh.identity_file:
            identity = os.path.expanduser(worker.ssh.identity_file)
            if not os.path.isfile(identity):
                raise FdlError(f"{worker.host}: ssh.identity_file {identity} does not exist")
        connection = fabric.Connection(
            worker.ssh_target,
            user=worker.ssh.user,
            port=worker.ssh.port,
            config=fabric.Config(ssh_config=ssh_config),
            connect_timeout=int(max(1, self.settings.connect_timeout)),
            connect_kwargs=connect_kwargs,
        )
        self._guard_host_keys(connection)
        return connection

    def _guard_host_keys(self, connection: fabric.Connection) -> None:
        known_hosts = Path(os.path.expanduser(self.settings.known_hosts))
        hop: Any = connection
        while isinstance(hop, fabric.Connection):  # the target and each ProxyJump hop
            if known_hosts.is_file():
                hop.client.load_host_keys(str(known_hosts))
            hop.client.set_missing_host_key_policy(TrustOnFirstUse(known_hosts))
            hop = hop.gateway

    def run(
        self,
        commands: Mapping[str, str],
        timeout: float | None,
        streams: Mapping[str, TextSink] | None = None,
    ) -> dict[str, Outcome]:
        """Run ``commands[label]`` on each host; never raises for a host's failure.

        Hosts with the same command share one ThreadingGroup; with ``streams``
        (launch) each host's output goes, as it comes, to its own stream, so
        each host is a group of its own.
        """
        groups: dict[tuple[str, str], list[str]] = {}
        for label, command in commands.items():
            groups.setdefault((command, label if streams else ""), []).append(label)
        outcomes: dict[str, Outcome] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, len(groups)))
        try:
            jobs = [
                pool.submit(self._run_group, labels, command, timeout, streams)
                for (command, _), labels in groups.items()
            ]
            for job in jobs:
                outcomes.update(job.result())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait here
        return outcomes

    def _run_group(
        self,
        labels: list[str],
        command: str,
        timeout: float | None,
        streams: Mapping[str, TextSink] | None,
    ) -> dict[str, Outcome]:
        group = fabric.ThreadingGroup.from_connections([self.connections[x] for x in labels])
        output: dict[str, Any] = {"hide": True}
        if streams:
            stream = streams[labels[0]]
            output = {"hide": False, "pty": False, "out_stream": stream, "err_stream": stream}
        try:
            results = group.run(command, warn=True, timeout=timeout, in_stream=False, **output)
        except GroupException as exc:
            results = exc.result
        outcomes: dict[str, Outcome] = {}
        for label in labels:
            result = results[self.connections[label]]
            if isinstance(result, BaseException):
                outcomes[label] = describe_failure(result, self.settings, self.workers[label])
            else:
                outcomes[label] = Reply(result.stdout, result.stderr, result.exited)
        return outcomes

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
