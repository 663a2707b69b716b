"""``fdl.gateways``: the setting's shape, the routes planned from it, the hop's command
lines, and each host's outcome sorted from what its gateway sent back."""

from __future__ import annotations

import shlex

import pytest

from fdl_tasks.config.model import SshSettings, Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.preflight.login_verdicts import failed_verdict
from fdl_tasks.ssh.gateways import (
    Heard,
    Route,
    gateway_command,
    hop_argv,
    hop_config,
    outcome,
    plan,
    rerouted,
    ssh_kind,
    unknown_labels,
)
from fdl_tasks.ssh.outcomes import Failure, FailureKind, Reply


def worker(label: str, target: str | None = None) -> Worker:
    return Worker(label, "/p", ssh=SshSettings(target=target))


WORKERS = [worker(f"n{i}", f"10.0.0.{i}") for i in range(1, 5)] + [worker("solo")]


def test_the_setting_takes_a_list_or_one_node_set() -> None:
    settings = Settings.from_config({"gateways": {"gw[1-2]": "n[1-2]", "gw3": ["n3", "n4"]}})
    assert settings.gateways == {"gw[1-2]": ("n[1-2]",), "gw3": ("n3", "n4")}
    assert Settings().gateways == {}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("gw1", "must be a mapping of gateway"),
        ({"gw1": []}, "gw1: must name the worker labels it serves"),
        ({"gw1": [3]}, "is not a list of worker labels"),
        ({"": "n1"}, "a gateway that is not a name"),
    ],
)
def test_a_setting_of_another_shape_is_refused(value: object, said: str) -> None:
    with pytest.raises(FdlError, match=said):
        Settings.from_config({"gateways": value})


def test_routes_name_hosts_by_their_ssh_target() -> None:
    routes = plan({"gw[1-2]": ("n[1-2]",), "gw3": ("n3", "n9")}, WORKERS)
    assert routes.routes == (Route(("gw1", "gw2"), ("n1", "n2")), Route(("gw3",), ("n3",)))
    assert routes.nodes == {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}
    assert routes.behind(["solo", "n2", "n4", "n1"]) == ["n2", "n1"]
    assert routes.route_of("n3") == Route(("gw3",), ("n3",))
    assert plan({}, WORKERS).behind(["n1"]) == []


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"gw1": ("n1",), "gw2": ("n[1-2]",)}, "n1 is served by both gw1 and gw2"),
        ({"10.0.0.2": ("n1",), "gw2": ("n2",)}, "10.0.0.2 is a gateway and the host n2 too"),
        ({"gw[1": ("n1",)}, "gateway 'gw\\[1' is not a name or node set"),
        ({"gw1": ("n[1-",)}, "host 'n\\[1-' is not a name or node set"),
    ],
)
def test_a_plan_that_cannot_be_a_tree_is_refused(
    setting: dict[str, tuple[str, ...]], said: str
) -> None:
    with pytest.raises(FdlError, match=said):
        plan(setting, WORKERS)


@pytest.mark.parametrize(
    ("setting", "target", "said"),
    [
        ({"-oProxyCommand=x": ("n1",)}, "10.0.0.1", "gateway '-oProxyCommand=x' must be a plain"),
        ({"gw": ("n1",)}, "root@10.0.0.1", "n1's target 'root@10.0.0.1' must be a plain"),
        ({"gw": ("n1",)}, "-F/x", "n1's target '-F/x' must be a plain"),
    ],
)
def test_names_that_ssh_or_clustershell_would_read_otherwise_are_refused(
    setting: dict[str, tuple[str, ...]], target: str, said: str
) -> None:
    with pytest.raises(FdlError, match=said):
        plan(setting, [worker("n1", target)])


def test_two_hosts_of_one_target_cannot_share_a_gateway() -> None:
    twins = [worker("a", "10.0.0.9"), worker("b", "10.0.0.9")]
    with pytest.raises(FdlError, match=r"a and b are both 10\.0\.0\.9"):
        plan({"gw": ("a", "b")}, twins)


def test_a_host_the_cluster_lacks_is_refused_with_a_close_name() -> None:
    unknown_labels({"gw": ("n1", "n[2-3]")}, ["n1", "n2", "n3"])
    with pytest.raises(FdlError, match=r"gw serves 'n1x', .*did you mean 'n1'"):
        unknown_labels({"gw": ("n1x",)}, ["n1", "n2"])


def test_the_hop_is_the_users_openssh_with_fdls_known_hosts() -> None:
    settings = Settings(connect_timeout=2.5, known_hosts="/k h", global_known_hosts="/g")
    argv = hop_argv(settings, "/tmp/c")
    assert argv[:3] == ["ssh", "-F", "/tmp/c"]
    assert "-oConnectTimeout=3" in argv and "-oBatchMode=yes" in argv
    assert '-oUserKnownHostsFile="/k h"' in argv and '-oGlobalKnownHostsFile="/g"' in argv
    assert hop_config(["/u/.ssh/config", "/etc/ssh/ssh_config"]) == (
        'Include "/u/.ssh/config"\nInclude "/etc/ssh/ssh_config"\n'
    )


def test_the_gateway_command_quotes_each_word() -> None:
    assert gateway_command(None) == "python3 -m ClusterShell.Gateway -Bu"
    command = gateway_command("env 'PYTHONPATH=/opt/a b' /opt/py;rm")
    assert shlex.split(command)[:3] == ["env", "PYTHONPATH=/opt/a b", "/opt/py;rm"]
    assert "'/opt/py;rm'" in command


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("No ED25519 host key is known for x; Host key verification failed.", "host_key"),
        ("root@10.0.0.1: Permission denied (publickey).", "auth"),
        ("ssh: connect to host 10.0.0.1 port 22: Connection refused", "unreachable"),
        ("ssh: connect to host 10.0.0.1 port 22: Connection timed out", "unreachable"),
        ('Load key "/k": invalid format', "key_file"),
        ("something new", "other"),
    ],
)
def test_openssh_words_sort_into_kinds(message: str, kind: str) -> None:
    assert ssh_kind(message).value == kind


ROUTE = Route(("gw1", "gw2"), ("n1",))
DOWN = {"gw1": Heard(stderr=["ssh: connect to host gw1 port 22: Connection refused"])}


def test_a_reply_through_the_gateway_is_the_hosts_own() -> None:
    heard = Heard(stdout=["a=1", "b=2"], stderr=["note"], rc=3, via="gw2")
    assert outcome(ROUTE, heard, DOWN, lost=None, timed_out=None) == Reply("a=1\nb=2\n", "note", 3)


def test_a_refusal_by_the_gateways_openssh_names_the_gateway() -> None:
    heard = Heard(stderr=["Host key verification failed."], rc=255, via="gw2")
    got = outcome(ROUTE, heard, DOWN, lost=None, timed_out=None)
    assert got == Failure(
        "Host key verification failed. (ssh from gateway gw2)", FailureKind.HOST_KEY
    )


def test_hosts_of_gateways_that_could_not_be_reached_were_not_asked() -> None:
    got = outcome(ROUTE, None, DOWN, lost=None, timed_out=None)
    assert isinstance(got, Failure) and got.kind is FailureKind.GATEWAY
    assert got.reason == (
        "not asked: no gateway could be reached (gw1: ssh: connect to host gw1 port 22: "
        "Connection refused; gw2: no message)"
    )


def test_a_gateway_lost_mid_run_is_no_verdict_on_its_hosts() -> None:
    got = outcome(ROUTE, Heard(stdout=["a=1"], rc=76), DOWN, lost="gw1", timed_out=None)
    assert isinstance(got, Failure) and got.kind is FailureKind.GATEWAY
    assert got.reason.startswith("no answer: gateway gw1 was lost while the command ran")
    verdict = failed_verdict("n1", "/d", got, "error")
    assert verdict.status == "warning" and verdict.failure == "gateway"
    assert verdict.warnings == (got.reason,)  # not "unreachable": the host was not asked


def test_a_host_out_of_time_names_its_gateway() -> None:
    got = outcome(ROUTE, Heard(stdout=["a"], via="gw2"), {}, lost=None, timed_out=20.0)
    assert got == Failure("no answer within 20 s (through gateway gw2)")
    assert outcome(ROUTE, None, {}, lost=None, timed_out=5.0) == Failure(
        "no answer within 5 s (through gateway gw1 or gw2)"
    )


def test_a_gateway_rerouted_from_is_one_warning() -> None:
    routes = [
        Route(("gw1", "gw2"), ("n1",)),
        Route(("gw1", "gw2"), ("n2",)),
        Route(("gw3",), ("n3",)),
    ]
    said = {"gw1": Heard(stderr=["Connection refused"])}
    assert rerouted(routes, {"gw1", "gw3"}, said) == [
        "gateway gw1 could not be reached (Connection refused); its hosts were asked "
        "through another"
    ]
    assert rerouted(routes, {"gw1", "gw2"}, said) == []  # their hosts say it themselves
