"""A first run as the quick start makes it, through the real ``inv`` (issue #31): a
minimal cluster file (no ``data_path``, no controller label) reads "ok"; what prebuild
says about its builds is true; mistakes and stops are said plainly.

Three rig hosts, each a real sshd; native cargo builds on the controller.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.harness import RigCluster, Running, inv_argv, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig]

HOSTS = [
    HostSpec("node-blackwell", "127.0.6.22"),
    HostSpec("node-pascal", "127.0.6.23"),
    HostSpec("node-cpu", "127.0.6.24"),
]
ARCHS = {
    "node-blackwell": "precompiled/cu128",
    "node-pascal": "builds/sm61-sm120",
    "node-cpu": "precompiled/cpu",
}
#: Builds at once are what these tests count: no compile cache (its first build runs alone).
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
#: A build's plain lines: ``prebuild: cu128 (node-blackwell) started``, ``… ok in 1.2s``.
STARTED = re.compile(r"^prebuild: (\S+ \([^)]*\)) started$")
ENDED = re.compile(r"^prebuild: (\S+ \([^)]*\)) (ok|FAILED|stopped)\b")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted(set(ARCHS.values()))
    with start_rig(tmp_path_factory.mktemp("first-run"), HOSTS, variants) as cluster:
        yield cluster


def minimal(rig: RigCluster, name: str = "minimal.yaml") -> Path:
    """As the quick start writes it: host, ssh, path and arch per worker, nothing else."""
    workers = []
    for host, arch in ARCHS.items():
        worker = rig.worker(host, arch=arch)
        del worker["data_path"]
        workers.append(worker)
    return rig.write(workers, name)


def unnamed(rig: RigCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``inv`` with no controller label set anywhere (only the hostname), as a new user runs it."""
    environment = rig.environment(ENV)
    del environment["FLODL_HOST_NAME"]
    return subprocess.run(
        inv_argv(*args),
        cwd=rig.root,
        env=environment,
        text=True,
        capture_output=True,
        timeout=600,
        check=False,
    )


def test_a_minimal_cluster_reads_ok(rig: RigCluster) -> None:
    done = unnamed(rig, "preflight", "--cluster-file", str(minimal(rig)))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert not [line for line in lines if line.startswith("  ok ")], done.stderr  # all ok
    assert "preflight: 4 ok, 0 with warnings, 0 with errors" in lines, done.stderr
    assert not [line for line in lines if "warning  " in line or "warning:" in line], lines
    # What nobody asked about: one line each, the data path's saying how to silence it.
    hostname = [line for line in lines if "names no host of" in line]
    data = [line for line in lines if "/flodl/data" in line]
    assert len(hostname) == 1 and len(data) == 1, done.stderr
    assert "--controller-host" in hostname[0] and "silence this" in data[0], done.stderr
    assert "node-blackwell, node-pascal, node-cpu" in data[0], data


def builds_at_once(stderr: str) -> int:
    """The most builds in flight at one time, from their started / ended lines."""
    running: set[str] = set()
    most = 0
    for line in stderr.splitlines():
        started, ended = STARTED.match(line), ENDED.match(line)
        if started:
            running.add(started.group(1))
            most = max(most, len(running))
        elif ended:
            running.discard(ended.group(1))
    return most


def test_the_builds_at_a_time_line_is_the_real_limit(rig: RigCluster) -> None:
    """One per core while a target dir is cold, two per core once all are built; each
    build sleeps in its build script, so that all the limit allows overlap."""
    path = minimal(rig, "jobs.yaml")
    cores = os.cpu_count() or 1
    for sleep, limit in (("1", min(cores, 3)), ("2", min(2 * cores, 3))):
        env = {**ENV, "FDL_FIXTURE_BUILD_SLEEP": sleep}  # changed: every build script reruns
        done = rig.inv(*prebuild_args(path), env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        assert f"prebuild: 3 build(s) with native cargo, {limit} at a time " in done.stderr
        assert builds_at_once(done.stderr) == limit, done.stderr


def test_a_mistyped_host_label_gets_a_suggestion(rig: RigCluster) -> None:
    path = minimal(rig, "typo.yaml")
    done = rig.inv("build-host", "--host", "node-pascl", "--cmd", "ddp-bench", "-f", str(path))
    assert done.returncode == 1
    assert done.stderr == (
        f"fdl: unknown host 'node-pascl': did you mean 'node-pascal'? {path} declares "
        "node-blackwell, node-pascal, node-cpu\n"
    )


def test_a_cluster_without_workers_is_an_error(rig: RigCluster) -> None:
    path = rig.write([], "empty.yaml")
    for task in ("preflight", "launch"):
        args = [task, "-f", str(path)] + (["--cmd", "ddp-bench"] if task == "launch" else [])
        done = rig.inv(*args)
        assert done.returncode == 1, (task, done.stderr)
        assert done.stderr.startswith(
            f"fdl: {path} lists no workers, so there is nothing to {task}: add one entry per "
            "host under 'workers:'"
        ), done.stderr
    assert rig.inv("clean", "--dry", "-f", str(path)).returncode == 0


def test_builds_stopped_by_ctrl_c_are_labelled_stopped(rig: RigCluster) -> None:
    path = minimal(rig, "stop.yaml")
    run: Running = rig.background(
        *prebuild_args(path), env={**ENV, "FDL_FIXTURE_BUILD_SLEEP": "90"}
    )
    run.wait_for(lambda: "Compiling ddp-bench" in run.stderr, 120)
    run.process.send_signal(signal.SIGINT)
    assert run.finish() == 130
    assert "interrupted: every build of this run was stopped" in run.stderr
    lines = run.stderr.splitlines()
    ended = [(i, m.group(2)) for i, m in enumerate(map(ENDED.match, lines)) if m]
    assert ended and {state for _, state in ended} == {"stopped"}, run.stderr
    assert "FAILED" not in run.stderr
    last = next(i for i, line in enumerate(lines) if line.startswith("fdl: interrupted"))
    assert all(i < last for i, _ in ended), run.stderr  # said before the run's last word
