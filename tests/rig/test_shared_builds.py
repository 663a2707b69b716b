"""One build per distinct build: counted from the real ``docker run`` invocations."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec(f"n{i}", f"127.0.0.{80 + i}") for i in range(8)]
ARCHS = {
    h.name: ("precompiled/cu128" if i % 2 else "builds/sm61-sm120") for i, h in enumerate(HOSTS)
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted(set(ARCHS.values()))
    with start_rig(tmp_path_factory.mktemp("shared"), HOSTS, variants, docker=True) as cluster:
        yield cluster


@pytest.fixture
def counted(rig: RigCluster) -> Path:
    """A ``docker`` first on PATH that records each invocation, then runs the real one;
    not a ``docker exec -d`` that parks a standby for the next run once one has ended
    (it starts no container and no build, and may come after the test has counted)."""
    shims = rig.root / "count-bin"
    shims.mkdir(exist_ok=True)
    log = rig.root / "docker-calls"
    log.write_text("")
    real = shutil.which("docker")
    shim = shims / "docker"
    shim.write_text(f'#!/bin/sh\n[ "$1 $2" = "exec -d" ] || echo "$1" >> {log}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    return log


def prebuild(rig: RigCluster, archs: dict[str, str], *extra: str) -> str:
    workers = [rig.worker(host, arch=arch) for host, arch in archs.items()]
    path = rig.write(workers, "shared.yaml", docker=rig.docker_settings())
    done = rig.inv(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--json",
        *extra,
        "--cluster-file",
        str(path),
        env={"PATH": f"{rig.root / 'count-bin'}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_each_host_runs_its_arch(rig: RigCluster, stdout: str, archs: dict[str, str]) -> None:
    envelopes = decode(stdout, "stdout")
    for host, arch in archs.items():
        assert (
            envelopes[host].bin
            == f"target/cluster/{host}/{arch.replace('/', '-')}/release/ddp-bench"
        )
        line = rig.run_on_host(host, str(rig.project), envelopes[host])
        assert line == f"ddp-bench variant={arch} cuda=on"


def test_eight_hosts_on_two_variants_cost_two_builds(rig: RigCluster, counted: Path) -> None:
    stdout = prebuild(rig, ARCHS)
    # two warm build containers started (run -d), one build (exec) in each
    assert sorted(counted.read_text().split()) == ["exec", "exec", "run", "run"]
    assert_each_host_runs_its_arch(rig, stdout, ARCHS)


def test_per_host_restores_one_build_per_host(rig: RigCluster, counted: Path) -> None:
    stdout = prebuild(rig, ARCHS, "--per-host")
    assert sorted(counted.read_text().split()) == ["exec"] * 8 + ["run"] * 8
    assert_each_host_runs_its_arch(rig, stdout, ARCHS)


def test_one_host_changing_arch_gets_its_new_binary(rig: RigCluster, counted: Path) -> None:
    prebuild(rig, ARCHS)
    changed = {**ARCHS, "n1": "builds/sm61-sm120"}
    stdout = prebuild(rig, changed)
    assert_each_host_runs_its_arch(rig, stdout, changed)
    assert (rig.project / "target/cluster/n1/precompiled-cu128").exists()  # old one untouched
