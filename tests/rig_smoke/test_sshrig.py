"""Smoke test of the ssh rig: real sshd per simulated host, real OpenSSH and Fabric clients."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fabric
import paramiko
import psutil
import pytest

from rig.sshrig import HostSpec, Rig, RigError

pytestmark = pytest.mark.rig

REPO = Path(__file__).resolve().parents[2]
HOSTS = [
    HostSpec("plain", "127.0.0.20"),
    HostSpec("arm", "127.0.0.21", uname_m="aarch64", glibc_version="2.17"),
    HostSpec("musl", "127.0.0.22", libc="musl", uname_m=""),
    HostSpec("locked", "127.0.0.23", user="fdlrig", pkill=False, data="unreadable"),
    HostSpec("gone", "127.0.0.24", listen="none", data="missing"),
    HostSpec("hang", "127.0.0.25", listen="hang"),
]
REAL_MACHINE = os.uname().machine
REAL_LDD_FIRST = subprocess.run(
    ["ldd", "--version"], capture_output=True, text=True, check=True
).stdout.splitlines()[0]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("sshrig"))
    try:
        r.up(HOSTS)
        yield r
    finally:
        r.down()


def ssh(rig: Rig, name: str, command: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        rig.ssh_argv(name, command), capture_output=True, text=True, timeout=20, **kw
    )


def connection(rig: Rig, name: str, **kw: Any) -> Any:
    entry = rig.ssh_entry(name)
    return fabric.Connection(
        str(entry["target"]),
        port=int(str(entry["port"])),
        user=str(entry["user"]),
        connect_kwargs={
            "key_filename": str(entry["identity_file"]),
            "look_for_keys": False,
            "allow_agent": False,
        },
        **kw,
    )


def keyscan(rig: Rig, name: str) -> str:
    entry = rig.ssh_entry(name)
    out = subprocess.run(
        ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(entry["port"]), str(entry["target"])],
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout
    keys = [" ".join(line.split()[1:3]) for line in out.splitlines() if not line.startswith("#")]
    assert len(keys) == 1, out
    return keys[0]


def test_ssh_entry_and_state(rig: Rig) -> None:
    assert rig.ssh_entry("locked") == {
        "target": "127.0.0.23",
        "port": 2222,
        "user": "fdlrig",
        "identity_file": str(rig.client_key),
    }
    assert rig.client_key.is_file()
    assert rig.host_dir("plain") == rig.state_dir / "hosts" / "plain"
    assert rig.data_path("plain").is_dir()
    assert not rig.data_path("gone").exists()
    assert set(Rig(rig.state_dir).hosts()) == {h.name for h in HOSTS}


def test_plain_host_is_the_real_machine(rig: Rig) -> None:
    data = rig.data_path("plain")
    res = ssh(
        rig, "plain", f"id -un; uname -m; command -v pkill; ldd --version | head -1; ls {data}"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:4] == ["root", REAL_MACHINE, "/usr/bin/pkill", REAL_LDD_FIRST]


def test_exit_code_and_streams_propagate(rig: Rig) -> None:
    res = ssh(rig, "plain", "echo out; echo err >&2; exit 7")
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "err\n")
    res = ssh(rig, "locked", "tr a-z A-Z", input="hello\n")
    assert (res.returncode, res.stdout) == (0, "HELLO\n")
    res = ssh(rig, "plain", "set -o pipefail; false | true")  # bash, the login shell
    assert res.returncode == 1


def test_aarch64_old_glibc_shims(rig: Rig) -> None:
    res = ssh(rig, "arm", "uname -m; arch; ldd --version | head -1; getconf GNU_LIBC_VERSION")
    assert res.stdout.splitlines() == ["aarch64", "aarch64", "ldd (GNU libc) 2.17", "glibc 2.17"]
    res = ssh(rig, "arm", "uname -s; uname -a | grep -c Linux; ldd /bin/ls")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:2] == ["Linux", "1"]
    assert any("libc.so.6" in line for line in lines[2:]), res.stdout


def test_musl_and_indeterminate_uname(rig: Rig) -> None:
    res = ssh(rig, "musl", "ldd --version")
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr.startswith(f"musl libc ({REAL_MACHINE})\nVersion 1.2.4\n")
    res = ssh(rig, "musl", "uname -m; echo rc=$?")
    assert res.stdout == "rc=0\n"
    res = ssh(rig, "musl", "ldd /bin/ls")
    assert res.returncode == 0 and "libc.so.6" in res.stdout
    assert ssh(rig, "musl", "getconf GNU_LIBC_VERSION").returncode == 1


def test_fdlrig_without_pkill_and_unreadable_data(rig: Rig) -> None:
    data = rig.data_path("locked")
    assert ssh(rig, "locked", "id -un").stdout == "fdlrig\n"
    assert ssh(rig, "locked", "command -v pkill").returncode != 0
    assert (
        ssh(rig, "locked", "command -v pgrep").stdout == f"{rig.host_dir('locked')}/sysbin/pgrep\n"
    )
    assert ssh(rig, "locked", f"test -d {data}").returncode == 0
    assert ssh(rig, "locked", f"test -r {data}").returncode != 0
    res = ssh(rig, "locked", f"ls {data}")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert ssh(rig, "locked", f"test -r {rig.data_path('plain')}").returncode == 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("plain", [REAL_MACHINE, "/usr/bin/pkill", REAL_LDD_FIRST]),
        ("arm", ["aarch64", "/usr/bin/pkill", "ldd (GNU libc) 2.17"]),
        ("musl", ["/usr/bin/pkill", f"musl libc ({REAL_MACHINE})"]),
        ("locked", [REAL_MACHINE, REAL_LDD_FIRST]),
    ],
)
def test_fabric_exec_sees_the_shims(rig: Rig, name: str, expected: list[str]) -> None:
    with connection(rig, name) as conn:
        res = conn.run(
            "uname -m; command -v pkill; ldd --version 2>&1 | head -1",
            warn=True,
            hide=True,
            in_stream=False,
        )
        assert res.stdout.splitlines() == expected
        res = conn.run("echo e >&2; exit 3", warn=True, hide=True, in_stream=False)
        assert (res.exited, res.stderr) == (3, "e\n")


def test_none_refuses(rig: Rig) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.24", 2222), timeout=2).close()
    res = ssh(rig, "gone", "true")
    assert res.returncode == 255 and "refused" in res.stderr


def test_hang_times_out(rig: Rig) -> None:
    start = time.monotonic()
    res = subprocess.run(
        rig.ssh_argv("hang", "true", connect_timeout=1), capture_output=True, text=True, timeout=20
    )
    assert res.returncode == 255 and "timed out" in res.stderr, res.stderr
    with pytest.raises(paramiko.SSHException), connection(rig, "hang", connect_timeout=1) as c:
        c.open()
    assert time.monotonic() - start < 12  # each default (20 s, 15 s) alone is longer


def test_rekey_changes_host_key(rig: Rig) -> None:
    before = keyscan(rig, "arm")
    assert before == rig.host_public_key("arm")
    rig.rekey("arm")
    after = keyscan(rig, "arm")
    assert after != before
    assert after == rig.host_public_key("arm")
    assert rig.known_hosts_line("arm") == f"[127.0.0.21]:2222 {after}"
    assert ssh(rig, "arm", "uname -m").stdout == "aarch64\n"


def test_stop_and_start_host_keeps_key(rig: Rig) -> None:
    key = keyscan(rig, "plain")
    rig.stop_host("plain")
    assert ssh(rig, "plain", "true").returncode == 255
    rig.start_host("plain")
    assert keyscan(rig, "plain") == key
    assert ssh(rig, "plain", "true").returncode == 0


def test_up_again_is_a_noop_and_clashes_fail_clearly(rig: Rig, tmp_path: Path) -> None:
    pids = sorted(rig.host_dir(h.name).joinpath("listener.pid").read_text() for h in HOSTS[:4])
    rig.up(HOSTS)
    assert (
        sorted(rig.host_dir(h.name).joinpath("listener.pid").read_text() for h in HOSTS[:4]) == pids
    )
    other = Rig(tmp_path / "other")
    with pytest.raises(RigError, match=r"127\.0\.0\.20:2222 is already in use"):
        other.up([HostSpec("dup", "127.0.0.20")])
    with pytest.raises(RigError, match=r"127\.0\.0\.25:2222 is already in use"):
        other.up([HostSpec("dup2", "127.0.0.25", listen="none")])
    other.down()


def test_down_from_another_process(tmp_path: Path) -> None:
    r = Rig(tmp_path / "cli")
    r.up([HostSpec("solo", "127.0.0.26")])
    pid = int(r.host_dir("solo").joinpath("listener.pid").read_text())
    res = subprocess.run(
        [sys.executable, "-m", "rig.sshrig", "down", str(r.state_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    r.down()  # reaps the listener (our child) and is idempotent
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.26", 2222), timeout=2).close()


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants, zombies included."""
    try:
        return {pid} | {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {pid}


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def test_down_stops_everything(rig: Rig) -> None:
    # A live session with a running remote command, which down() must end too.
    client = subprocess.Popen(
        rig.ssh_argv("locked", "sleep 120"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    listeners = [
        int(rig.host_dir(h.name).joinpath("listener.pid").read_text())
        for h in HOSTS
        if h.listen != "none"
    ]
    deadline = time.monotonic() + 10
    while not any("sleep" in _cmdline(p) for p in _tree(listeners[3])):
        assert time.monotonic() < deadline, "remote sleep never started"
        time.sleep(0.05)
    pids = set().union(*(_tree(p) for p in listeners))
    rig.down()
    assert client.wait(timeout=10) == 255
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
    rig.down()  # twice is fine
    pgrep = subprocess.run(["pgrep", "-af", "sshd|python"], capture_output=True, text=True)
    assert str(rig.state_dir) not in pgrep.stdout
    assert not any(rig.host_dir(h.name).joinpath("listener.pid").exists() for h in HOSTS)
