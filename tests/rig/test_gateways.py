"""``fdl.gateways``: ``inv preflight`` asks hosts through a real gateway host.

The gateway is a rig host with its own real sshd. The controller's OpenSSH logs in to
it and starts ClusterShell's gateway there, under a Python of the gateway's own (a venv
made with the system ``python3``, ClusterShell copied into its site-packages, as an
admin's ``pip install`` would leave it; named by ClusterShell's
``CLUSTERSHELL_GW_PYTHON_EXECUTABLE``). The gateway's OpenSSH dials the hosts behind it.

Every rig host is a login on this one machine, so the gateway user's ``~/.ssh/config``
cannot be the gateway's own: an ``ssh`` on the gateway's ``PATH`` (its session's shim
directory) adds ``-F`` with the gateway's config, its key and its known_hosts, which
knows two of the three hosts behind it. A second gateway has nothing listening.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ClusterShell
import psutil
import pytest
import yaml

from rig.harness import RigCluster, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

GATEWAY, DOWN = "127.0.0.13", "127.0.0.17"
HOSTS = [
    HostSpec("gw", GATEWAY),
    HostSpec("near-a", "127.0.0.14"),
    HostSpec("near-b", "127.0.0.15", user="fdlrig"),
    HostSpec("stranger", "127.0.0.16"),  # up, but its key is not in the gateway's file
    HostSpec("gwdown", DOWN, listen="none"),
    HostSpec("far", "127.0.0.18"),  # behind the gateway that is down
    HostSpec("slow", "127.0.0.19"),  # its probe waits: time to lose the gateway meanwhile
]
BEHIND = ["near-a", "near-b", "stranger"]
VARIANT = "precompiled/cpu"


def gateway_python(rig: RigCluster) -> Path:
    """A venv of the system Python with ClusterShell in it: the gateway's interpreter."""
    venv = rig.root / "gateway-venv"
    if not venv.exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        shutil.copytree(Path(ClusterShell.__file__).parent, site / "ClusterShell")
    return venv / "bin" / "python3"


def gateway_ssh(rig: RigCluster) -> None:
    """The gateway's own ssh config, known_hosts and key, through a shim on its PATH."""
    known = rig.root / "gateway-known-hosts"
    known.write_text(
        "".join(rig.rig.known_hosts_line(x) + "\n" for x in ("near-a", "near-b", "slow"))
    )
    config = rig.root / "gateway-ssh-config"
    blocks = [f"Host {rig.rig.spec(x).address}\n  User {rig.rig.spec(x).user}\n" for x in BEHIND]
    config.write_text(
        "".join(blocks)
        + f"Host *\n  Port 2222\n  IdentityFile {rig.rig.client_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
    )
    shim = rig.rig.host_dir("gw") / "bin" / "ssh"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
    shim.chmod(0o755)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("gateways"), HOSTS, [VARIANT]) as cluster:
        gateway_ssh(cluster)
        yield cluster


def slow_probe(rig: RigCluster) -> Path:
    """``slow``'s ``uname`` leaves a mark, then takes a minute: its probe hangs there."""
    mark = rig.root / "slow-probe-started"
    shim = rig.rig.host_dir("slow") / "bin" / "uname"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\ntouch {mark}\nsleep 60\nexec /usr/bin/uname "$@"\n')
    shim.chmod(0o755)
    return mark


def preflight_argv(rig: RigCluster, gateways: dict[str, Any], hosts: tuple[str, ...]) -> list[str]:
    """``preflight --json`` for these hosts, with these gateways in the project's invoke.yaml."""
    (rig.root / "invoke.yaml").write_text(yaml.safe_dump({"fdl": {"gateways": gateways}}))
    # The controller knows the gateway's key, as after an admin's first login.
    rig.known_hosts.write_text(rig.rig.known_hosts_line("gw") + "\n")
    workers = [rig.worker(x) for x in hosts]
    controller = {"host": "ctrl", "path": str(rig.project), "ssh": {"target": "127.0.0.1"}}
    path = rig.write([controller, *workers])
    return ["preflight", "--json", "--cluster-file", str(path)]


def environment(rig: RigCluster) -> dict[str, str]:
    """The gateway's interpreter; the controller's ssh config, with how to log in to the
    gateways."""
    config = rig.root / "controller-ssh-config"
    config.write_text(
        f"Host {GATEWAY} {DOWN}\n  Port 2222\n  User root\n"
        f"  IdentityFile {rig.rig.client_key}\n  IdentitiesOnly yes\n"
    )
    return {
        "CLUSTERSHELL_GW_PYTHON_EXECUTABLE": str(gateway_python(rig)),
        "INVOKE_FDL_SSH_CONFIG": str(config),
    }


def preflight(
    rig: RigCluster, gateways: dict[str, Any], hosts: tuple[str, ...] = (*BEHIND, "far")
) -> subprocess.CompletedProcess[str]:
    return rig.inv(*preflight_argv(rig, gateways, hosts), env=environment(rig))


def verdicts(stdout: str) -> dict[str, Any]:
    return {v["host"]: v for v in json.loads(stdout)}


@pytest.fixture(scope="module")
def through(rig: RigCluster) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = preflight(rig, {GATEWAY: BEHIND, DOWN: "far"})
    assert "Traceback" not in done.stderr, done.stderr
    return done, verdicts(done.stdout)


def test_verdicts_come_back_through_the_gateway(
    rig: RigCluster, through: tuple[subprocess.CompletedProcess[str], dict[str, Any]]
) -> None:
    _, got = through
    for host in ("near-a", "near-b"):
        assert got[host]["status"] == "ok", got[host]
        assert got[host]["failure"] is None
    # Asked through the gateway, not directly: the controller never met their keys.
    known = rig.known_hosts.read_text()
    assert "127.0.0.14" not in known and "127.0.0.15" not in known, known


def test_a_key_the_gateway_refuses_is_a_host_key_error(
    through: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    done, got = through
    assert done.returncode == 1, done.stderr
    stranger = got["stranger"]
    assert (stranger["status"], stranger["failure"]) == ("error", "host_key"), stranger
    said = " ".join(stranger["errors"])
    assert "Host key verification failed" in said and f"gateway {GATEWAY}" in said, said


def test_a_gateway_down_is_said_for_its_hosts(
    through: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    _, got = through
    far = got["far"]
    assert (far["status"], far["failure"]) == ("warning", "gateway"), far
    said = " ".join(far["warnings"])
    assert DOWN in said and "Connection refused" in said and "not asked" in said, said


def test_a_host_the_cluster_does_not_have_is_refused(rig: RigCluster) -> None:
    done = preflight(rig, {GATEWAY: ["near-a", "naer-b"]})
    assert done.returncode == 1
    assert "fdl.gateways" in done.stderr and "did you mean 'near-b'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_hosts_go_through_another_gateway_of_their_route(rig: RigCluster) -> None:
    done = preflight(rig, {f"{GATEWAY},{DOWN}": ["near-a", "near-b"]}, ("near-a", "near-b"))
    assert done.returncode == 0, done.stderr
    got = verdicts(done.stdout)
    assert [got[x]["status"] for x in ("near-a", "near-b")] == ["ok", "ok"], got
    assert f"gateway {DOWN} could not be reached" in done.stderr, done.stderr
    assert "Connection refused" in done.stderr and "asked through another" in done.stderr


def test_a_gateway_without_clustershell_says_so(rig: RigCluster) -> None:
    argv = preflight_argv(rig, {GATEWAY: "near-a"}, ("near-a",))
    bare = {**environment(rig), "CLUSTERSHELL_GW_PYTHON_EXECUTABLE": "/usr/bin/python3"}
    done = rig.inv(*argv, env=bare)
    assert done.returncode == 0, done.stderr
    near = verdicts(done.stdout)["near-a"]
    assert (near["status"], near["failure"]) == ("warning", "gateway"), near
    said = " ".join(near["warnings"])
    assert f"not asked: no gateway could be reached ({GATEWAY}: " in said, said
    assert "No module named 'ClusterShell'" in said, said


def test_a_dry_run_says_which_hosts_go_through_a_gateway(rig: RigCluster) -> None:
    argv = preflight_argv(rig, {GATEWAY: "near-a"}, ("near-a", "far"))
    done = rig.inv("--dry", *argv, env=environment(rig))
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert f"[near-a] gateway {GATEWAY}, then ssh 127.0.0.14 " in said, said
    assert "[far] ssh root@127.0.0.18:2222 " in said, said


def test_published_binaries_are_verified_through_the_gateway(rig: RigCluster) -> None:
    preflight_argv(rig, {GATEWAY: ["near-a", "near-b"]}, ())  # the settings and known_hosts
    path = rig.write([rig.worker(x, arch=VARIANT) for x in ("near-a", "near-b")], "built.yaml")
    env = {**environment(rig), "INVOKE_FDL_COMPILE_CACHE": "0"}  # native cargo, no sccache
    done = rig.inv(*prebuild_args(path), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "verify: 2 host(s) verified (same bytes, every library resolves)" in done.stderr, (
        done.stderr
    )
    known = rig.known_hosts.read_text()
    assert "127.0.0.14" not in known and "127.0.0.15" not in known, known


def gateway_process(rig: RigCluster) -> psutil.Process:
    """ClusterShell's gateway, running in a session of the gateway host."""
    marker = str(rig.rig.host_dir("gw"))
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "ClusterShell.Gateway" in (process.info["cmdline"] or []) and (
                process.environ().get("FDLRIG_HOST_DIR") == marker
            ):
                return process
    raise AssertionError("no ClusterShell gateway runs on the gateway host")


def test_a_gateway_lost_mid_run_is_no_verdict_on_its_hosts(rig: RigCluster) -> None:
    mark = slow_probe(rig)
    argv = preflight_argv(rig, {GATEWAY: "slow"}, ("slow",))
    running = rig.background(*argv, env=environment(rig))
    running.wait_for(mark.exists, timeout=60)
    gateway_process(rig).kill()  # the gateway dies; the host's probe runs on
    assert running.finish(timeout=60) == 0, running.stderr
    slow = verdicts(running.stdout)["slow"]
    assert (slow["status"], slow["failure"]) == ("warning", "gateway"), slow["warnings"]
    said = " ".join(slow["warnings"])
    assert f"gateway {GATEWAY} was lost while the command ran" in said, said
    assert "Traceback" not in running.stderr
