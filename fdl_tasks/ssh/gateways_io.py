"""Commands run through gateways with ClusterShell's tree mode (``fdl.gateways``).

One ClusterShell task per call, in a thread of its own (a task belongs to its thread,
so no gateway marked unreachable by an earlier call stays marked). The hop to a gateway
is ClusterShell's exec worker running :func:`~fdl_tasks.ssh.gateways.hop_argv` (an argv,
no shell), so the ssh options of this controller never travel to the gateways: there,
ClusterShell's own ssh worker dials each host with the gateway's ssh config. Hosts
sharing one script share one tree worker.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ClusterShell.Event import EventHandler
from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
from ClusterShell.Propagation import RouteResolvingError
from ClusterShell.Task import Task, task_self
from ClusterShell.Task import TimeoutError as TreeTimeout
from ClusterShell.Topology import TopologyGraph
from ClusterShell.Worker.Exec import ExecClient, ExecWorker
from ClusterShell.Worker.Tree import TreeWorker

from fdl_tasks.config.settings import Settings
from fdl_tasks.core.reporting import Severity
from fdl_tasks.ssh.gateways import (
    ROOT,
    GatewayPlan,
    Heard,
    gateway_command,
    hop_argv,
    hop_config,
    outcome,
    rerouted,
)
from fdl_tasks.ssh.outcomes import Outcome, Reply

if TYPE_CHECKING:
    from fdl_tasks.ssh.remote import Fleet

#: Seconds past the budgets before the whole tree is given up on.
SLACK = 10.0


class _Listener(EventHandler):  # type: ignore[misc]
    """Every line and exit code, by node (a gateway's own ssh errors under its name)."""

    def __init__(self, heard: dict[str, Heard], deadline: float) -> None:
        super().__init__()
        self.heard, self.deadline = heard, deadline
        self.unreachable: set[str] = set()

    def late(self) -> bool:
        """Past the whole run's budget: what an abort says then is no answer."""
        return time.monotonic() > self.deadline

    def _of(self, node: Any) -> Heard | None:
        return None if self.late() else self.heard.setdefault(str(node), Heard())

    def ev_read(self, worker: Any, node: Any, sname: str, msg: bytes) -> None:
        if (heard := self._of(node)) is not None:
            text = msg.decode("utf-8", "replace")
            (heard.stderr if sname == "stderr" else heard.stdout).append(text)

    def ev_hup(self, worker: Any, node: Any, rc: int) -> None:
        if (heard := self._of(node)) is not None:
            heard.rc = rc
            heard.via = worker.via.get(str(node), "")

    def _ev_routing(self, worker: Any, arg: dict[str, Any]) -> None:
        if arg.get("event") == "reroute":
            self.unreachable.add(str(arg["gateway"]))


class _Tree(TreeWorker):  # type: ignore[misc]
    """ClusterShell's tree worker, which remembers what its handler is not told: the
    gateway each host answered through, and the hosts each gateway's end aborted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.via: dict[str, str] = {}
        self.aborted: dict[str, str] = {}

    def _on_remote_node_close(self, node: Any, rc: int, gateway: Any) -> None:
        self.via[str(node)] = str(gateway)
        super()._on_remote_node_close(node, rc, gateway)

    def _gateway_abort(self, gateway: Any) -> None:
        if not self.eh.late():  # not the abort of a run out of time
            for target in self.gwtargets.get(str(gateway), ()):
                self.aborted[str(target)] = str(gateway)
        super()._gateway_abort(gateway)

    def _relaunch(self, previous_gateway: Any) -> None:
        """A gateway that could not be set up: its hosts go to another of their gateways;
        with none left they stay unanswered (said as such), and the others run on."""
        try:
            super()._relaunch(previous_gateway)
        except RouteResolvingError:
            self._check_fini()


def _hop_worker(argv: list[str]) -> type[ExecWorker]:
    class Hop(ExecClient):  # type: ignore[misc]
        def _build_cmd(self) -> tuple[list[str], None]:
            return [*argv, str(self.key), self.command], None

    class HopWorker(ExecWorker):  # type: ignore[misc]
        SHELL_CLASS = Hop

    return HopWorker


def _topology(plan: GatewayPlan) -> Any:
    """This controller to every gateway, each route's gateways to its hosts."""
    graph = TopologyGraph()
    graph.add_route(_nodes([ROOT]), _nodes(g for r in plan.routes for g in r.gateways))
    for route in plan.routes:
        graph.add_route(_nodes(route.gateways), _nodes(plan.nodes[x] for x in route.labels))
    return graph.to_tree(ROOT)


def _nodes(names: Iterable[str]) -> NodeSet:
    """Plain names as a node set, no group (``@``) looked up in ClusterShell's files."""
    return NodeSet.fromlist(list(names), resolver=RESOLVER_NOGROUP)


def _run(
    plan: GatewayPlan, scripts: Mapping[str, str], settings: Settings, timeout: float | None
) -> tuple[dict[str, Outcome], list[str]]:
    tree = _topology(plan)
    budget = (timeout or settings.probe_timeout) + 2 * settings.connect_timeout + SLACK
    heard: dict[str, Heard] = {}
    listener = _Listener(heard, time.monotonic() + budget)
    files = (os.path.expanduser(p) for p in (settings.ssh_config, settings.system_ssh_config))
    by_script: dict[str, list[str]] = {}
    for label, script in scripts.items():
        by_script.setdefault(script, []).append(plan.nodes[label])
    with tempfile.NamedTemporaryFile("w", prefix="fdl-gateway-", suffix=".conf") as config:
        config.write(hop_config(files))
        config.flush()
        task: Task = task_self()
        task.set_default("distant_worker", _hop_worker(hop_argv(settings, config.name)))
        task.set_info("connect_timeout", settings.connect_timeout)
        task.set_info("fanout", settings.ssh_sessions or 1 << 16)
        task.topology = tree  # one router for every tree worker: gateways share the load
        command = gateway_command(os.environ.get("CLUSTERSHELL_GW_PYTHON_EXECUTABLE"))
        trees = []
        for script, nodes in by_script.items():
            worker = _Tree(NodeSet.fromlist(nodes), listener, timeout, command=script, stderr=True)
            worker.invoke_gateway = command
            task.schedule(worker)
            trees.append(worker)
        with contextlib.suppress(TreeTimeout):  # the rest aborted: unanswered, said below
            task.resume(timeout=budget)
    # A gateway rerouted from was never set up: hosts it aborted were not asked (their
    # exit code is ClusterShell's), not lost.
    aborted = {n: g for w in trees for n, g in w.aborted.items()}
    lost = {n: g for n, g in aborted.items() if g not in listener.unreachable}
    timed = {str(n) for w in trees for n in w.iter_keys_timeout()}
    gateways = {g: heard.get(g, Heard()) for r in plan.routes for g in r.gateways}
    outcomes: dict[str, Outcome] = {}
    for label in scripts:
        node, route = plan.nodes[label], plan.route_of(label)
        assert route is not None  # every label here was planned behind a gateway
        answered = None if node in aborted and node not in lost else heard.get(node)
        unanswered = answered is None or answered.rc is None
        refused = set(route.gateways) <= listener.unreachable
        slow: float | None = None
        if node in timed:
            slow = timeout
        elif unanswered and not refused and node not in lost:
            slow = budget
        outcomes[label] = outcome(route, answered, gateways, lost=lost.get(node), timed_out=slow)
    return outcomes, rerouted(plan.routes, listener.unreachable, gateways)


def start(
    plan: GatewayPlan, scripts: Mapping[str, str], settings: Settings, timeout: float | None
) -> Future[tuple[dict[str, Outcome], list[str]]]:
    """Run ``scripts[label]`` on each host through its gateways, in a thread of its own:
    each host's outcome, and a warning for each gateway its hosts were rerouted from."""
    future: Future[tuple[dict[str, Outcome], list[str]]] = Future()

    def work() -> None:
        try:
            future.set_result(_run(plan, scripts, settings, timeout))
        except BaseException as exc:  # handed to the caller, raised there
            future.set_exception(exc)

    threading.Thread(target=work, name="fdl-gateways", daemon=True).start()
    return future


def split_run(
    fleet: Fleet, behind: list[str], scripts: Mapping[str, str], timeout: float | None
) -> dict[str, Outcome]:
    """:meth:`Fleet.run` when some hosts are behind gateways: those through them, the
    others directly at the same time; a warning for each gateway rerouted from."""
    started = time.monotonic()
    routed = start(fleet.gateways, {x: scripts[x] for x in behind}, fleet.settings, timeout)
    direct = fleet.run({x: s for x, s in scripts.items() if x not in behind}, timeout)
    through, warnings = routed.result()
    for warning in warnings:
        fleet.report(warning, Severity.WARNING)
    outcomes = {**direct, **through}
    ended = time.monotonic()
    fleet.rounds.extend((x, started, ended, isinstance(outcomes[x], Reply)) for x in behind)
    return {x: outcomes[x] for x in scripts}
