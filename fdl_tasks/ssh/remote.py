"""Fabric connections to the workers: one per host, kept open for a whole task.

Each worker's ``ssh.options`` become an ssh_config block placed before the
user's own ``~/.ssh/config`` and the system's ``/etc/ssh/ssh_config``, so
Fabric applies them as OpenSSH would (first value wins). Host keys, each host's
``StrictHostKeyChecking``, known_hosts files (:mod:`fdl_tasks.ssh.known_hosts_io`) and
``ConnectTimeout`` (its connect, banner and auth) are as OpenSSH has them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import fabric
import paramiko

from fdl_tasks.config.model import Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.console import TextSink
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, Severity
from fdl_tasks.ssh.gateways import plan
from fdl_tasks.ssh.known_hosts_io import KnownHostsView, SharedHostKeys, explain_refusal
from fdl_tasks.ssh.login_facts import Identity, greet, load_identity, login_of, quiet_paramiko
from fdl_tasks.ssh.outcomes import Failure, Outcome, Reply
from fdl_tasks.ssh.ssh_failures import describe_failure, key_file_failure, wants_greeting
from fdl_tasks.ssh.sshconfig import connect_budget, host_key_options, read_config, ssh_config_block
from fdl_tasks.ssh.transports import FleetRemote, hang_up, prompt_transport, settle


class _Hop(NamedTuple):
    """One connection on the way to a worker (the worker itself, or a ProxyJump hop)."""

    connection: fabric.Connection
    name: str  # as known_hosts names it: host, or [host]:port
    view: KnownHostsView
    what: str  # "" for the worker itself, "jump host " for a hop


class Fleet:
    """Fabric connections to some workers; commands fan out over a bounded pool.

    A collected fan-out opens and asks each host in turn, ``settings.ssh_sessions``
    hosts at a time; a launch runs every host at once. Handshakes run
    ``settings.ssh_window`` at a time: a host's connect, banner and auth clocks
    start when its own attempt starts, so hosts waiting their turn are never
    charged for the controller's queue; each host's budget is
    its own ``ConnectTimeout``, else ``settings.connect_timeout``. What is the
    same for every host (each known_hosts file, parsed once; one Fabric config
    per distinct ssh_config block; the loaded identity) is built once.
    """

    def __init__(
        self, workers: Iterable[Worker], settings: Settings, report: Report, once: bool = False
    ) -> None:
        """``once``: each host is asked one thing (``inv preflight``), so its login ends
        with its answer; a fleet's servers then do not hold every session to the end."""
        quiet_paramiko()
        self.settings, self.report, self.once = settings, report, once
        self.workers: dict[str, Worker] = {w.host: w for w in workers}
        self.gateways = plan(settings.gateways, self.workers.values())
        self.failed: dict[str, Failure] = {}
        #: Every round trip so far: host, start, end (monotonic), whether it ran (``--timings``).
        self.rounds: list[tuple[str, float, float, bool]] = []
        self._config_files = "".join(
            read_config(path) for path in (settings.ssh_config, settings.system_ssh_config)
        )
        self._host_keys = SharedHostKeys()
        self._hops: dict[str, list[_Hop]] = {}
        self._budgets: dict[str, float] = {}
        self._configs: dict[str, fabric.Config] = {}
        self._identities: dict[str, Identity] = {}
        self._unusable: dict[str, Identity] = {}  # hosts whose identity is no private key
        self._closed = False
        #: One handshake per host at a time (a background opening, a build's first ask).
        self._opening = {label: threading.Lock() for label in self.workers}
        self.connections: dict[str, fabric.Connection] = {
            label: self._connect(w, report) for label, w in self.workers.items()
        }
        for warning in self._host_keys.warnings():
            report(warning, Severity.WARNING)

    def _config(self, block: str) -> fabric.Config:
        if block not in self._configs:
            self._configs[block] = fabric.Config(
                ssh_config=paramiko.SSHConfig.from_text(block + self._config_files),
                overrides={"runners": {"remote": FleetRemote}},
            )
        return self._configs[block]

    def _identity_kwargs(self, worker: Worker) -> dict[str, Any]:
        """The worker's identity alone, like ``IdentitiesOnly``: no agent, no ~/.ssh/id_*."""
        if not worker.ssh.identity_file:
            return {}
        identity = os.path.expanduser(worker.ssh.identity_file)
        if identity not in self._identities:
            self._identities[identity] = load_identity(identity)
        loaded = self._identities[identity]
        if loaded.unusable:
            self._unusable[worker.host] = loaded
        only = {"look_for_keys": False, "allow_agent": False}
        return {} if loaded.pkey is None else {"pkey": loaded.pkey, **only}

    def _connect(self, worker: Worker, report: Report) -> fabric.Connection:
        block, ignored = ssh_config_block(worker)
        for key in ignored:
            report(
                f"{worker.host}: ssh option {key} is not supported by Fabric/paramiko "
                "and is ignored",
                Severity.WARNING,
            )
        try:
            connection = fabric.Connection(
                worker.ssh_target,
                user=worker.ssh.user,
                port=worker.ssh.port,
                config=self._config(block),
                connect_kwargs=self._identity_kwargs(worker),
            )
        except ValueError as exc:  # Fabric's int() of a jump host's ConnectTimeout
            raise FdlError(f"{worker.host}: its ssh configuration is not usable: {exc}") from None
        hops: list[_Hop] = []
        hop: Any = connection
        while isinstance(hop, fabric.Connection):  # the target and each ProxyJump hop
            budget = connect_budget(worker.host, hop.host, hop.ssh_config, self.settings)
            hop.connect_timeout = budget
            # A jump host's channel is the TCP connect to the next hop: the connect budget.
            # The target's own channels open on a login already made: a slow one is a busy
            # host (256 launches at once on one rig), not a dead one, so the probe's budget.
            channel = max(budget, self.settings.probe_timeout) if not hops else budget
            hop.connect_kwargs = {
                **hop.connect_kwargs,
                "banner_timeout": budget,
                "auth_timeout": budget,
                "channel_timeout": channel,
                "transport_factory": prompt_transport,
            }
            options = host_key_options(
                worker.host,
                hop.ssh_config,
                {"h": hop.host, "p": str(hop.port), "r": hop.user, "n": hop.original_host},
                self.settings.known_hosts,
                self.settings.global_known_hosts,
            )
            view = self._host_keys.guard(worker.host, hop.client, options)
            name = hop.host if hop.port == 22 else f"[{hop.host}]:{hop.port}"
            hops.append(_Hop(hop, name, view, "jump host " if hops else ""))
            hop = hop.gateway
        self._hops[worker.host] = hops
        self._budgets[worker.host] = hops[0].connection.connect_timeout
        return connection

    def _failure(self, label: str, exc: BaseException) -> Failure:
        """One line for a host's failure; a changed key names the hop and the file."""
        if isinstance(exc, paramiko.BadHostKeyException):
            hops = [h for h in self._hops[label] if h.connection.host == exc.hostname]
            hop = next(  # paramiko does not say which port: the hop that knows the old key
                (h for h in hops if h.view.source_of(h.name, exc.expected_key) is not None),
                (hops or self._hops[label])[0],
            )
            exc = explain_refusal(exc, hop.name, hop.view, hop.what)
        connection, budget = self.connections[label], self._budgets[label]
        direct = connection.gateway is None
        answer = (
            greet(connection.host, connection.port, budget)
            if direct and wants_greeting(exc)
            else ""
        )
        return describe_failure(exc, login_of(connection, answer=answer), budget)

    def open(self, labels: Iterable[str]) -> dict[str, Failure]:
        """Handshake with these hosts, ``ssh_window`` at a time; the ones that failed. A
        host already open is not opened again; one that failed stays failed."""
        wanted = list(labels)
        todo = [x for x in wanted if self._unopened(x)]
        if todo:
            window = self.settings.ssh_window or len(todo)
            with ThreadPoolExecutor(max_workers=min(window, len(todo))) as pool:
                list(pool.map(self._attempt, todo))
            self._say_added()
        return {x: self.failed[x] for x in wanted if x in self.failed}

    @contextlib.contextmanager
    def opening(self, labels: Iterable[str]) -> Iterator[None]:
        """Handshake with these hosts in the background while the body runs (a watch
        cycle's builds), so that what follows pays its round trips, not the logins.

        Leaving normally waits for the handshakes; leaving by an exception does not
        (a stop must not wait on a slow host): :meth:`close` hangs up what they open.
        """
        wanted = list(labels)
        behind = set(self.gateways.behind(wanted))  # asked through their gateway, not by us
        todo = [x for x in wanted if x not in behind and self._unopened(x)]
        if not todo:
            yield
            return
        opener = threading.Thread(target=self.open, args=(todo,), daemon=True, name="fdl-open")
        opener.start()
        yield
        opener.join()

    def _unopened(self, label: str) -> bool:
        return label not in self.failed and not self.connections[label].is_connected

    def _attempt(self, label: str) -> None:
        """One handshake, unless another thread made it meanwhile (a background opening);
        a failure is remembered as that host's."""
        with self._opening[label]:
            if not self._unopened(label):
                return
            if label in self._unusable:  # never offered: said as what it is
                login = login_of(self.connections[label])
                self.failed[label] = key_file_failure(login, self._unusable[label].why)
                return
            try:
                self.connections[label].open()
                settle(self.connections[label])
            except Exception as exc:  # any handshake failure is that host's failure
                self.failed[label] = self._failure(label, exc)
                self.connections[label].close()
            if self._closed:  # opened in the background after close() (an interrupted build)
                hang_up(self.connections[label])

    def _say_added(self) -> None:
        for line in self._host_keys.take_added():
            self.report(line, Severity.WARNING)

    def run(
        self,
        scripts: Mapping[str, str],
        timeout: float | None,
        streams: Mapping[str, TextSink] | None = None,
    ) -> dict[str, Outcome]:
        """Run ``scripts[label]`` on each host; never raises for a host's failure.

        Each host is opened (``ssh_window`` handshakes at a time) and asked in turn,
        ``ssh_sessions`` at a time, so threads and each server's load stay bounded. With
        ``streams`` (launch), every host is opened, then all run at once, each one's output
        to its own stream as it comes; else ``fdl.gateways``' hosts go through them.
        """
        started = time.monotonic()
        if not streams and (behind := self.gateways.behind(scripts)):  # a launch: direct
            from fdl_tasks.ssh.gateways_io import split_run  # ClusterShell's engine: when used

            return split_run(self, behind, scripts, timeout)
        if streams:
            self.open(scripts)
        sessions = len(scripts) if streams else self.settings.ssh_sessions or len(scripts)
        handshakes = threading.BoundedSemaphore(self.settings.ssh_window or len(scripts))

        def ask(label: str) -> tuple[str, Outcome]:
            if self._unopened(label):
                with handshakes:
                    self._attempt(label)
            outcome = self.failed.get(label) or self._ask(label, scripts[label], timeout, streams)
            self.rounds.append((label, started, time.monotonic(), isinstance(outcome, Reply)))
            if self.once:
                hang_up(self.connections[label])
            return label, outcome

        pool = ThreadPoolExecutor(max_workers=max(1, min(sessions, len(scripts))))
        try:
            outcomes = dict(pool.map(ask, scripts))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait here
        self._say_added()
        return outcomes

    def _ask(
        self, label: str, script: str, timeout: float | None, streams: Mapping[str, TextSink] | None
    ) -> Outcome:
        output: dict[str, Any] = {"hide": True}
        if streams:
            stream = streams[label]
            output = {"hide": False, "pty": False, "out_stream": stream, "err_stream": stream}
        try:
            result = self.connections[label].run(
                script, warn=True, timeout=timeout, in_stream=False, **output
            )
        except Exception as exc:  # any failure is that host's
            return self._failure(label, exc)
        return Reply(result.stdout, result.stderr, result.exited)

    def close(self) -> None:
        self._closed = True
        for connection in self.connections.values():
            hang_up(connection)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
