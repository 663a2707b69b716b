"""Hosts behind gateways (``fdl.gateways``): ClusterShell's tree planned, and what came back
from each host sorted into the same outcomes the direct fan-out gives.

The controller dials each gateway with OpenSSH (this module's argv: the user's ssh
config, fdl's known_hosts files, ``BatchMode``), and starts ClusterShell's gateway
there; the gateway dials its hosts with its own OpenSSH and its own ssh config. A host
is named to its gateway by its ssh target. Pure; :mod:`fdl_tasks.ssh.gateways_io` runs it.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.suggest import close_matches, quoted_choice
from fdl_tasks.ssh.outcomes import Failure, FailureKind, Outcome, Reply

#: The topology's root: this controller. No host is dialled by that name.
ROOT = "fdl-controller"
#: The gateway's interpreter when ``CLUSTERSHELL_GW_PYTHON_EXECUTABLE`` does not name one.
GATEWAY_PYTHON = "python3"
#: A host name or IPv4 address, as both OpenSSH and ClusterShell's node sets take it.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: What OpenSSH exits with when it, not the command, failed.
SSH_FAILED = 255
#: OpenSSH's words for each kind of failure, first match wins.
_SSH_WORDS = (
    (FailureKind.HOST_KEY, ("host key verification failed", "host identification has changed")),
    (FailureKind.HOST_KEY, ("revoked",)),
    (FailureKind.AUTH, ("permission denied", "too many authentication failures")),
    (FailureKind.KEY_FILE, ("load key", "invalid format")),
    (FailureKind.NOT_SSH, ("kex_exchange_identification", "bad packet length")),
    (FailureKind.UNREACHABLE, ("connection refused", "timed out", "no route to host")),
    (FailureKind.UNREACHABLE, ("could not resolve", "network is unreachable", "closed by")),
)


@attrs.frozen
class Route:
    """Hosts (worker labels) and the gateways that serve them, any one of them."""

    gateways: tuple[str, ...]
    labels: tuple[str, ...]

    @property
    def said(self) -> str:
        return " or ".join(self.gateways)


@attrs.frozen
class GatewayPlan:
    """Which host goes through which gateways, and the name its gateway dials."""

    routes: tuple[Route, ...]
    #: Worker label to the node name ClusterShell uses for it: its ssh target.
    nodes: Mapping[str, str]

    def route_of(self, label: str) -> Route | None:
        return next((r for r in self.routes if label in r.labels), None)

    def behind(self, labels: Iterable[str]) -> list[str]:
        """The labels among these that are asked through a gateway."""
        return [x for x in labels if x in self.nodes]


def expand(text: str, what: str) -> list[str]:
    """A name or a ClusterShell node set (``gw[1-4]``), no groups, as names."""
    # Imported here: only a cluster with gateways expands names, and every inv loads this.
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

    try:
        return list(NodeSet(text, resolver=RESOLVER_NOGROUP))
    except NodeSetParseError as exc:
        raise FdlError(f"fdl.gateways: {what} {text!r} is not a name or node set: {exc}") from None


def plain(name: str, what: str) -> str:
    """A name that is itself as a ClusterShell node and cannot be read as an ssh option."""
    if not _PLAIN.fullmatch(name) or expand(name, what) != [name]:
        raise FdlError(
            f"fdl.gateways: {what} {name!r} must be a plain host name or address to go "
            "through a gateway (letters, digits, '.', '_', '-'; no user@ nor port)"
        )
    return name


def unknown_labels(setting: Mapping[str, Sequence[str]], labels: Collection[str]) -> None:
    """Refuse a setting that names a host the cluster file does not have."""
    for gateway, served in setting.items():
        for label in (x for text in served for x in expand(text, "host")):
            if label not in labels:
                close = close_matches(label, labels)
                hint = f" (did you mean {quoted_choice(close)}?)" if close else ""
                raise FdlError(
                    f"fdl.gateways: {gateway} serves {label!r}, which is no worker of the "
                    f"cluster file{hint}"
                )


def plan(setting: Mapping[str, Sequence[str]], workers: Iterable[Worker]) -> GatewayPlan:
    """The routes of these workers; a host served twice, or a gateway that is also a
    host, or two hosts with one ssh target, is refused."""
    by_label = {w.host: w for w in workers}
    routes: list[Route] = []
    seen: dict[str, str] = {}
    for key, served in setting.items():
        gateways = tuple(plain(g, "gateway") for g in expand(key, "gateway"))
        labels = [x for text in served for x in expand(text, "host")]
        for label in labels:
            if label in seen:
                raise FdlError(f"fdl.gateways: {label} is served by both {seen[label]} and {key}")
            seen[label] = key
        routes.append(Route(gateways, tuple(x for x in labels if x in by_label)))
    nodes = {x: plain(by_label[x].ssh_target, f"{x}'s target") for r in routes for x in r.labels}
    every = {g for r in routes for g in r.gateways}
    named: dict[str, str] = {}
    for label, node in nodes.items():
        if node in every:
            raise FdlError(f"fdl.gateways: {node} is a gateway and the host {label} too")
        if (twin := named.setdefault(node, label)) != label:
            raise FdlError(
                f"fdl.gateways: {twin} and {label} are both {node}; behind a gateway a host "
                "is named by its ssh target alone"
            )
    return GatewayPlan(tuple(r for r in routes if r.labels), nodes)


def hop_argv(settings: Settings, config_file: str) -> list[str]:
    """The controller's OpenSSH to a gateway: the user's ssh config (``config_file``
    includes it), fdl's known_hosts files, no prompt, the connect budget."""
    return [
        "ssh",
        "-F",
        config_file,
        "-oBatchMode=yes",
        f"-oConnectTimeout={math.ceil(settings.connect_timeout)}",
        f'-oUserKnownHostsFile="{settings.known_hosts}"',
        f'-oGlobalKnownHostsFile="{settings.global_known_hosts}"',
        "-oForwardAgent=no",
        "-oForwardX11=no",
    ]


def hop_config(paths: Iterable[str]) -> str:
    """The ssh config of the hop to a gateway: the user's and the system's files, as
    Fabric reads them for a direct host (a missing one is no error)."""
    return "".join(f'Include "{path}"\n' for path in paths)


def gateway_command(python: str | None) -> str:
    """What the gateway's login runs: ClusterShell's gateway under that interpreter
    (``CLUSTERSHELL_GW_PYTHON_EXECUTABLE``, ClusterShell's own knob; words kept apart)."""
    words = shlex.split(python or GATEWAY_PYTHON) or [GATEWAY_PYTHON]
    return shlex.join([*words, "-m", "ClusterShell.Gateway", "-Bu"])


def ssh_kind(message: str) -> FailureKind:
    """The kind of an OpenSSH client failure, from its words."""
    lowered = message.lower()
    return next(
        (kind for kind, words in _SSH_WORDS if any(w in lowered for w in words)), FailureKind.OTHER
    )


@attrs.define
class Heard:
    """What came back from one host (or one gateway's own ssh) as it ran."""

    stdout: list[str] = attrs.Factory(list)
    stderr: list[str] = attrs.Factory(list)
    rc: int | None = None
    #: The gateway that answered for the host.
    via: str = ""


def last_words(heard: Heard | None) -> str:
    lines = list(dict.fromkeys(x.strip() for x in (heard.stderr if heard else []) if x.strip()))
    return "; ".join(lines[-2:]) or "no message"


def outcome(
    route: Route,
    heard: Heard | None,
    gateways: Mapping[str, Heard],
    *,
    lost: str | None,
    timed_out: float | None,
) -> Outcome:
    """One host's outcome: its reply, or why it has none, naming the gateway.

    ``gateways``: what each gateway's own ssh said; ``lost``: the gateway that died
    while this host's command ran; ``timed_out``: the budget the host ran out of."""
    if lost is not None:
        return Failure(
            f"no answer: gateway {lost} was lost while the command ran "
            f"({last_words(gateways.get(lost))})",
            FailureKind.GATEWAY,
        )
    if timed_out is not None:
        via = heard.via if heard and heard.via else route.said
        return Failure(f"no answer within {timed_out:g} s (through gateway {via})")
    if heard is None or heard.rc is None:
        said = "; ".join(f"{g}: {last_words(gateways.get(g))}" for g in route.gateways)
        return Failure(f"not asked: no gateway could be reached ({said})", FailureKind.GATEWAY)
    if heard.rc == SSH_FAILED:
        words = last_words(heard) if heard.stderr else f"ssh exited {SSH_FAILED}, no message"
        return Failure(f"{words} (ssh from gateway {heard.via or route.said})", ssh_kind(words))
    return Reply("".join(x + "\n" for x in heard.stdout), "\n".join(heard.stderr), heard.rc)


def rerouted(
    routes: Iterable[Route], unreachable: Collection[str], said: Mapping[str, Heard]
) -> list[str]:
    """A warning for each gateway that could not be reached while another of its route
    could: its hosts were asked through the others (ClusterShell's re-dispatch)."""
    return [
        f"gateway {g} could not be reached ({last_words(said.get(g))}); its hosts were "
        "asked through another"
        for g in dict.fromkeys(g for r in routes for g in r.gateways if g in unreachable)
        if any(set(r.gateways) - set(unreachable) for r in routes if g in r.gateways)
    ]
