"""``inv preflight`` against real sshd hosts that differ the way real hosts do.

aarch64, musl, an old glibc and a missing pkill cannot exist on this machine:
the rig simulates them with per-host shims on PATH, served through each
host's own real sshd (see rig/sshrig.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

#: Budgets no healthy host can miss however busy the controller is, so that no
#: verdict depends on the machine being idle; on success they cost nothing.
TIMEOUTS = {"INVOKE_FDL_CONNECT_TIMEOUT": "30", "INVOKE_FDL_PROBE_TIMEOUT": "60"}
#: The hung host never answers, whatever its budget: its own ConnectTimeout keeps
#: the runs short (paramiko's banner default would be 15 s).
HUNG_BUDGET = 2
HOSTS = [
    HostSpec("plain", "127.0.0.30"),
    HostSpec("arm", "127.0.0.31", uname_m="aarch64"),
    HostSpec("musl", "127.0.0.32", libc="musl"),
    HostSpec("nopkill", "127.0.0.33", pkill=False),
    HostSpec("nodata", "127.0.0.34", data="missing"),
    HostSpec("unreadable", "127.0.0.35", user="fdlrig", data="unreadable"),
    HostSpec("elsewhere", "127.0.0.36"),
    HostSpec("down", "127.0.0.37", listen="none"),
    HostSpec("hung", "127.0.0.38", listen="hang"),
    HostSpec("blank", "127.0.0.39", uname_m=""),
    HostSpec("oldlibc", "127.0.0.40", glibc_version="2.17"),
    HostSpec("nodefault", "127.0.0.41"),
    HostSpec("rekeyed", "127.0.0.42"),
]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("preflight"), HOSTS) as cluster:
        yield cluster


def all_workers(rig: RigCluster) -> list[dict[str, Any]]:
    workers = [rig.worker(h.name) for h in HOSTS if h.name not in ("nodefault", "rekeyed")]
    elsewhere = rig.root / "mnt-elsewhere"
    if not elsewhere.exists():
        elsewhere.symlink_to(rig.project)
    workers[6]["path"] = str(elsewhere)
    hung = next(w for w in workers if w["host"] == "hung")
    hung["ssh"] = {**hung["ssh"], "options": [f"ConnectTimeout={HUNG_BUDGET}"]}
    nodefault = rig.worker("nodefault")
    del nodefault["data_path"]  # the convention default, /flodl/data, is absent here
    controller = {
        "host": "ctrl",
        "path": str(rig.project),
        "data_path": str(rig.project),
        "ssh": {"target": "127.0.0.1"},
    }
    return [controller, *workers, nodefault]


def verdicts(stdout: str) -> dict[str, dict[str, Any]]:
    return {v["host"]: v for v in json.loads(stdout)}


def problems(verdict: dict[str, Any]) -> str:
    return " | ".join(verdict["errors"] + verdict["warnings"])


def test_every_host_verdict_in_one_run(rig: RigCluster) -> None:
    path = rig.write(all_workers(rig))
    started = time.monotonic()
    done = rig.inv("preflight", "--json", "--cluster-file", str(path), env=TIMEOUTS)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    got = verdicts(done.stdout)
    assert got["ctrl"]["local"] and got["ctrl"]["status"] == "ok"
    expected = {
        "plain": ("ok", ""),
        "arm": ("error", "aarch64 differs"),
        "musl": ("error", "musl libc"),
        "nopkill": ("warning", "pkill not found"),
        "nodata": ("error", "declared data_path"),
        "unreadable": ("error", "not readable by the login user"),
        "elsewhere": ("ok", ""),
        "down": ("warning", "connection refused"),
        "hung": ("warning", f"established within {HUNG_BUDGET}s (no SSH banner"),
        "blank": ("warning", "'uname -m' gave no answer"),
        "oldlibc": ("warning", "glibc 2.17 is older"),
        "nodefault": ("ok", ""),  # a note: see below
    }
    for host, (status, fragment) in expected.items():
        assert got[host]["status"] == status, (host, got[host])
        assert fragment in problems(got[host]), (host, got[host])
    assert got["arm"]["cpu_arch"] == "aarch64" and "musl" in got["musl"]["libc"]
    assert "default data_path /flodl/data is missing" in got["nodefault"]["notes"][0]
    assert "preflight: 4 ok, 5 with warnings, 4 with errors (arm, musl, nodata, unreadable)" in (
        done.stderr
    )
    noted = [line for line in done.stderr.splitlines() if "/flodl/data" in line]
    assert noted == [
        "  note     no data_path declared, and the default /flodl/data is missing on nodefault: "
        "fine without shared storage (declare data_path: on those hosts to silence this; a "
        "declared one must exist)"
    ], done.stderr
    assert "Traceback" not in done.stderr and "paramiko" not in done.stderr
    # The hung host costs its own connect budget, not paramiko's 15 s banner default.
    assert elapsed < 15, elapsed


def test_no_prebuild_skips_the_abi_gate_but_checks_data(rig: RigCluster) -> None:
    path = rig.write(all_workers(rig))
    done = rig.inv(
        "preflight", "--no-prebuild", "--json", "--cluster-file", str(path), env=TIMEOUTS
    )
    got = verdicts(done.stdout)
    assert got["arm"]["status"] == "ok" and got["musl"]["status"] == "ok", done.stderr
    assert got["nopkill"]["status"] == "ok" and got["arm"]["cpu_arch"] is None, done.stderr
    assert got["nodata"]["status"] == "error", (got["nodata"], done.stderr)
    assert got["unreadable"]["status"] == "error", (got["unreadable"], done.stderr)
    assert done.returncode == 1


def test_all_ok_exits_zero_and_remembers_host_keys(rig: RigCluster) -> None:
    path = rig.write([rig.worker("plain"), rig.worker("nopkill")], "ok.yaml")
    done = rig.inv("preflight", "--cluster-file", str(path), env=TIMEOUTS)
    assert done.returncode == 0, done.stderr
    assert "[127.0.0.30]:2222 ssh-ed25519" in rig.known_hosts.read_text()


def test_changed_host_key_is_an_error(rig: RigCluster) -> None:
    path = rig.write([rig.worker("rekeyed")], "rekeyed.yaml")
    assert rig.inv("preflight", "--cluster-file", str(path), env=TIMEOUTS).returncode == 0
    rig.rig.rekey("rekeyed")
    done = rig.inv("preflight", "--cluster-file", str(path), env=TIMEOUTS)
    assert done.returncode == 1
    assert "error    rekeyed: host key of 127.0.0.42:2222 does not match" in done.stderr


def test_ssh_options_are_applied_or_warned_about(rig: RigCluster) -> None:
    via_live = rig.worker(
        "nopkill",
        ssh={
            **rig.rig.ssh_entry("nopkill"),
            "options": ["ProxyJump=root@127.0.0.30:2222", "ServerAliveInterval=5"],
        },
    )
    via_dead = rig.worker(
        "blank", ssh={**rig.rig.ssh_entry("blank"), "options": ["ProxyJump root@127.0.0.37:2222"]}
    )
    path = rig.write([via_live, via_dead], "options.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path), env=TIMEOUTS)
    got = verdicts(done.stdout)
    assert got["nopkill"]["status"] == "warning" and got["nopkill"]["pkill"] is False
    # blank's own sshd is up: only the jump host being down explains this.
    assert "connection refused" in problems(got["blank"])
    assert done.stderr.count("ssh option ServerAliveInterval is not supported") == 1


def test_dry_run_prints_probes_and_contacts_nobody(rig: RigCluster) -> None:
    path = rig.write([rig.worker("down"), rig.worker("plain")], "dry.yaml")
    before = Path(rig.known_hosts).read_text() if rig.known_hosts.exists() else ""
    done = rig.inv("--dry", "preflight", "--cluster-file", str(path))
    assert done.returncode == 0
    assert "[down] ssh root@127.0.0.37:2222" in done.stderr
    assert done.stdout == ""
    assert (rig.known_hosts.read_text() if rig.known_hosts.exists() else "") == before


def test_system_ssh_config_is_honoured(rig: RigCluster) -> None:
    """Like OpenSSH (and Fabric's own loading), /etc/ssh/ssh_config applies after ~/.ssh/config."""
    entry = rig.rig.ssh_entry("plain")
    system = rig.root / "system_ssh_config"
    system.write_text(
        "Host plain-alias\n"
        f"    HostName {entry['target']}\n    Port {entry['port']}\n"
        f"    User {entry['user']}\n    IdentityFile {entry['identity_file']}\n"
    )
    worker = {**rig.worker("plain"), "host": "plain-alias"}
    del worker["ssh"]
    path = rig.write([worker], "system.yaml")
    unset = rig.inv("preflight", "--json", "--cluster-file", str(path), env=TIMEOUTS)
    assert "unreachable" in problems(verdicts(unset.stdout)["plain-alias"])
    env = {**TIMEOUTS, "INVOKE_FDL_SYSTEM_SSH_CONFIG": str(system)}
    done = rig.inv("preflight", "--json", "--cluster-file", str(path), env=env)
    assert done.returncode == 0, done.stderr
    assert verdicts(done.stdout)["plain-alias"]["status"] == "ok"
