"""256 simulated hosts with default settings: every verdict honest, every host served.

One real sshd per 16 loopback addresses (:class:`rig.fleetrig.FleetRig`); every
host is healthy, so any "unreachable" would be a false one. Not timed: the
benchmark (``python3 -m bench.fleet``) measures; this checks verdicts.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.publish.envelope import decode
from rig.fleetrig import FleetRig
from rig.harness import rig_env, run_inv, write_cluster, write_tasks_file
from rig.project import make_project

pytestmark = pytest.mark.rig

HOSTS = 256
VARIANT = "precompiled/cpu"
PORT = 2301


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("fleet")
    rig = FleetRig(root / "fleet", port=PORT, net="127.0.5")
    project = make_project(root / "project", [VARIANT])
    workers = [{**w, "arch": VARIANT} for w in rig.workers(HOSTS, str(project))]
    write_tasks_file(root)
    controller = {"path": str(project), "data_path": str(rig.data)}
    write_cluster(root / "cluster.yaml", controller, workers)
    rig.up(HOSTS)
    try:
        # The product's own default budgets: the fleet claim is about them.
        defaults = {"INVOKE_FDL_CONNECT_TIMEOUT": "5", "INVOKE_FDL_PROBE_TIMEOUT": "20"}
        yield root, rig_env(root, root / "known_hosts", defaults)
    finally:
        rig.down()


def names() -> set[str]:
    return {f"node-{i:04d}" for i in range(HOSTS)}


def test_preflight_gives_every_host_its_verdict(fleet: tuple[Path, dict[str, str]]) -> None:
    root, env = fleet
    for _ in range(2):  # the first run learns every host key, the second reads them all
        done = run_inv(root, "preflight", "--json", env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        verdicts = {v["host"]: v for v in json.loads(done.stdout)}
        assert set(verdicts) == names() | {"ctrl"}
        assert [h for h, v in verdicts.items() if v["status"] != "ok"] == []
        assert f"preflight: {HOSTS + 1} ok, 0 with warnings, 0 with errors" in done.stderr


def test_prebuild_verifies_and_launch_runs_on_every_host(
    fleet: tuple[Path, dict[str, str]],
) -> None:
    root, env = fleet
    built = run_inv(root, "prebuild", "--cmd", "ddp-bench", "--json", env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "1 build(s) with native cargo" in built.stderr
    assert (
        f"verify: {HOSTS} host(s) verified (same bytes, every library resolves)\n" in built.stderr
    )
    assert set(decode(built.stdout, "stdout")) == names()
    launched = run_inv(root, "launch", "--cmd", "ddp-bench", env=env, timeout=600)
    assert launched.returncode == 0, launched.stderr[-2000:]
    lines = {line for line in launched.stdout.splitlines() if "variant=" in line}
    assert lines == {f"[{name}] ddp-bench variant={VARIANT} cuda=off" for name in names()}


def open_logins() -> int:
    """The controller's established ssh connections to the fleet now."""
    done = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( dport = :{PORT} )"],
        capture_output=True,
        text=True,
        check=True,
    )
    return len(done.stdout.splitlines())


def test_preflight_hangs_up_each_host_once_it_answered(fleet: tuple[Path, dict[str, str]]) -> None:
    """Nothing after the probe asks a host again, so no login outlives its answer: a fleet's
    servers never hold every session at once (at 4,096 hosts that cost them 5 ms a host)."""
    root, env = fleet
    sessions = 32
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], open_logins())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        env = {**env, "INVOKE_FDL_SSH_SESSIONS": str(sessions)}
        done = run_inv(root, "preflight", env=env, timeout=300)
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr[-2000:]
    assert 0 < peak[0] <= sessions + 8, peak[0]  # held to the end, it would reach 256
