"""``launch`` with flodl's semantics, on the rig: stopping it leaves nothing behind.

The rig's hosts are sshd instances on this machine, so "no process survives on
the host" is checked in this machine's process table, by each host's own
binary path (``target/cluster/<host>/…`` differs per host).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [HostSpec("run-a", "127.0.0.90"), HostSpec("run-b", "127.0.0.91")]
ARCHS = {"run-a": "precompiled/cu128", "run-b": "precompiled/cpu"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("launch"), HOSTS, list(ARCHS.values())) as cluster:
        path = cluster_file(cluster, "launch.yaml")
        done = cluster.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
        assert done.returncode == 0, done.stderr
        yield cluster


@pytest.fixture(autouse=True)
def no_leftovers(rig: RigCluster) -> Iterator[None]:
    yield
    Running.stop_all()
    for pid in binary_processes(rig):
        os.kill(pid, signal.SIGKILL)


def cluster_file(rig: RigCluster, name: str, **env: dict[str, str]) -> Path:
    workers = [rig.worker(host, arch=arch, env=env.get(host, {})) for host, arch in ARCHS.items()]
    return rig.write(workers, name)


def binaries(rig: RigCluster) -> dict[str, str]:
    envelope = decode(
        (rig.project / "target/cluster/_envelopes/ddp-bench.json").read_text(), "envelope"
    )
    return {host: str(rig.project / entry.bin) for host, entry in envelope.items()}


def binary_processes(rig: RigCluster) -> list[int]:
    """Processes running one of the hosts' prebuilt binaries, wherever they came from."""
    wanted = set(binaries(rig).values())
    return [
        process.pid
        for process in psutil.process_iter(["cmdline"])
        if (process.info["cmdline"] or [""])[0] in wanted
    ]


def launch_wrappers(rig: RigCluster) -> list[int]:
    """The remote sessions' wrapper shells of this rig's launch (not another run's on the
    same machine): the shells whose script waits on one of this rig's binaries."""
    wanted = set(binaries(rig).values())
    found = []
    for process in psutil.process_iter(["cmdline"]):
        script = " ".join(process.info["cmdline"] or [])
        if "__fdl_pid=$!" in script and any(binary in script for binary in wanted):
            found.append(process.pid)
    return found


def wait_until(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.1)
    return False


def start_launch(rig: RigCluster, path: Path, seconds: int, *quiet: str) -> Running:
    """``inv launch`` in the background, once every host's program has printed a few steps."""
    run = rig.background(
        "launch",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        "--",
        "--heartbeat",
        str(seconds),
        *quiet,
        env={},
    )
    run.wait_for(lambda: all(f"[{h}] step 3" in run.stdout for h in ARCHS), timeout=60)
    assert len(binary_processes(rig)) == len(ARCHS)
    return run


def test_sigterm_on_launch_stops_the_program_on_every_host(rig: RigCluster) -> None:
    """The programs are silent by then: only launch's own stop can end them."""
    run = start_launch(rig, cluster_file(rig, "term.yaml"), 120, "--quiet")
    run.process.send_signal(signal.SIGTERM)
    assert run.finish(timeout=60) == 130  # a stop by the user, not a failure
    assert "interrupted: ddp-bench was stopped on every host" in run.stderr
    assert binary_processes(rig) == []


def test_ctrl_c_on_launch_stops_the_program_on_every_host(rig: RigCluster) -> None:
    run = start_launch(rig, cluster_file(rig, "int.yaml"), 120, "--quiet")
    run.process.send_signal(signal.SIGINT)
    assert run.finish(timeout=60) != 0
    assert binary_processes(rig) == []


def test_dropped_connection_leaves_no_process(rig: RigCluster) -> None:
    """SIGKILL gives the client no chance to clean up: the ssh connections just drop.

    The remote program loses its output channel; the next line it writes ends
    it, and the wrapper's after-run clearing takes anything left.
    """
    run = start_launch(rig, cluster_file(rig, "drop.yaml"), seconds=120)
    run.process.kill()
    run.finish(timeout=30)
    assert wait_until(lambda: binary_processes(rig) == [], timeout=15), binary_processes(rig)


def test_hang_up_reaches_the_program_as_term(rig: RigCluster) -> None:
    """A hang-up of the remote session (SIGHUP to its wrapper shell) stops the program."""
    run = start_launch(rig, cluster_file(rig, "hup.yaml"), 120, "--quiet")
    wrappers = launch_wrappers(rig)
    assert len(wrappers) == len(ARCHS)
    for pid in wrappers:
        os.kill(pid, signal.SIGHUP)
    assert run.finish(timeout=60) == 1
    assert "launch failed on run-a" in run.stderr and "run-b" in run.stderr
    assert binary_processes(rig) == []


def test_stale_orphans_are_cleared_before_the_spawn(rig: RigCluster) -> None:
    """A leftover of an earlier run (same binary) is stopped before the new one starts."""
    binary = binaries(rig)["run-b"]
    lib = rig.project / "libtorch/precompiled/cpu/lib"
    orphan = subprocess.Popen(
        [binary, "--heartbeat", "300"],
        env={"LD_LIBRARY_PATH": str(lib)},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(0.3)
    assert orphan.poll() is None
    done = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "launch.yaml"))
    assert done.returncode == 0, done.stderr
    assert orphan.wait(timeout=10) == -signal.SIGTERM
    assert "[run-b] ddp-bench variant=precompiled/cpu" in done.stdout


def test_worker_ld_library_path_is_used_as_given(rig: RigCluster) -> None:
    """The user's explicit LD_LIBRARY_PATH wins over the envelope's (flodl's rule)."""
    other = str(rig.project / "libtorch/precompiled/cpu/lib")
    path = cluster_file(rig, "ld.yaml", **{"run-a": {"LD_LIBRARY_PATH": other}})
    done = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert "[run-a] ddp-bench variant=precompiled/cpu cuda=on" in done.stdout
    assert "[run-b] ddp-bench variant=precompiled/cpu cuda=off" in done.stdout
