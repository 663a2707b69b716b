"""Compose mode on the rig: a flodl-shaped project built exactly the way flodl builds it.

The project has flodl's ``docker-compose.yml`` services (``dev``, ``cuda``;
see :func:`rig.project.write_compose_file`) and an ``fdl.cluster.yml`` written
the way flodl documents it, under ``cluster:``, with the string form of
``controller.docker`` and flodl's own worker keys.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fdl_tasks.build.backends.compose import compose_line
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.build.docker_tools import remove_containers
from fdl_tasks.config.loader import load_cluster
from fdl_tasks.config.model import ComposeService
from fdl_tasks.publish.envelope import PerHostEnvelope, decode
from rig.harness import RigCluster, containers, prebuild_args, start_rig
from rig.project import write_compose_file
from rig.sshrig import HostSpec
from tests.rig.test_everyday import docker_calls

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("gb-1", "127.0.0.95", gpus="blackwell"),  # its local_devices: all counts one
    HostSpec("gb-2", "127.0.0.96"),
    HostSpec("pascal", "127.0.0.97"),
]
#: Seconds the builds stopped by a signal would last, and the budget for that stop:
#: far apart, so that only a real stop (not builds ending on their own) meets it.
BUILD_SLEEP = 180
STOP_BUDGET = 10
ARCHS = {"gb-1": "precompiled/cu128", "gb-2": "precompiled/cu128", "pascal": "builds/sm61-sm120"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted({*ARCHS.values(), "precompiled/cpu"})
    with start_rig(tmp_path_factory.mktemp("compose"), HOSTS, variants, docker=True) as cluster:
        write_compose_file(cluster.project)
        yield cluster


@pytest.fixture(autouse=True)
def fresh_targets(rig: RigCluster) -> None:
    shutil.rmtree(rig.project / "target", ignore_errors=True)


def flodl_cluster_file(rig: RigCluster, service: str = "cuda") -> Path:
    """fdl.cluster.yml as flodl writes it: ``cluster:``, controller host/port, worker keys."""
    workers: list[dict[str, Any]] = []
    for index, (host, arch) in enumerate(ARCHS.items()):
        entry = rig.worker(host, arch=arch)
        entry |= {
            "local_devices": [0] if index else "all",
            "nccl_socket_ifname": "lo",
            "tunnel": index == 2,
            "docker": "cuda",
        }
        if host == "gb-2":
            entry["gpu_ram_share"] = 0.5
        workers.append(entry)
    controller = {"host": "127.0.0.1", "port": 1337, "path": str(rig.project), "docker": service}
    data = {"cluster": {"controller": controller, "workers": workers, "gpu_ram_share": 0.25}}
    path = rig.project / "fdl.cluster.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def without_compose_plugin(rig: RigCluster) -> dict[str, str]:
    """PATH with a ``docker`` that lacks the Compose plugin: a machine with only v1.

    (The plugin is one binary next to the real client; hiding it from one
    process is the only way to have both kinds of machine here at once.)
    """
    shim = rig.root / "no-compose-plugin"
    shim.mkdir(exist_ok=True)
    docker = shim / "docker"
    docker.write_text(
        '#!/bin/sh\n[ "$1" = compose ] && { echo "unknown command: compose" >&2; exit 1; }\n'
        'exec /usr/bin/docker "$@"\n'
    )
    docker.chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}


@pytest.mark.parametrize("compose", ["v2", "v1"])
def test_flodl_project_prebuilds_in_compose_mode_and_launches(
    rig: RigCluster, compose: str
) -> None:
    path = flodl_cluster_file(rig)
    env = without_compose_plugin(rig) if compose == "v1" else {}
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--json", "--cluster-file", str(path), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(" started") == 2  # gb-1 and gb-2 share one build
    tool = "docker-compose" if compose == "v1" else "docker compose"
    assert f"2 build(s) with {tool} run," in done.stderr
    launched = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert launched.returncode == 0, launched.stderr
    for host, arch in ARCHS.items():
        assert f"[{host}] ddp-bench variant={arch} cuda=on" in launched.stdout
    owners = {p.stat().st_uid for p in (rig.project / "target/cluster").rglob("*")}
    assert owners == {os.geteuid()}


def test_compose_run_writes_files_as_the_invoking_user(rig: RigCluster) -> None:
    """UID/GID reach the compose file's ``user:`` (bash never exports UID by itself).

    The tests run as root, so the command prebuild renders for a non-root
    caller (4321) is run as is, and every file it wrote is checked.
    """
    cluster = load_cluster(flodl_cluster_file(rig))
    compose = cluster.controller.docker
    assert isinstance(compose, ComposeService)
    job = plan_builds(
        [cluster.worker("pascal")], backend_for(cluster), "ddp-bench", "ddp-bench", False
    )[0]
    target = rig.project / job.target_dir
    target.mkdir(parents=True)
    os.chown(target, 4321, 4321)
    command = compose_line(
        job, cluster.controller, compose, ["docker", "compose"], "uidtest", (4321, 4321)
    )
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in target.rglob("*")}
    assert owners == {(4321, 4321)}
    entry = PerHostEnvelope(
        job.built_binary, str(rig.project / "libtorch/builds/sm61-sm120/lib"), "ddp-bench"
    )
    ran = rig.run_on_host("pascal", str(rig.project), entry)
    assert ran == "ddp-bench variant=builds/sm61-sm120 cuda=on"


def test_missing_service_fails_before_any_build(rig: RigCluster) -> None:
    path = flodl_cluster_file(rig, service="rocm")
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 1
    assert "compose service 'rocm'" in done.stderr and "defines only: cuda, dev" in done.stderr
    assert "Traceback" not in done.stderr and " started" not in done.stderr
    assert not (rig.project / "target/cluster/_shared").exists()


def test_sigterm_removes_every_compose_container(rig: RigCluster) -> None:
    path = flodl_cluster_file(rig)
    run = rig.background(
        *prebuild_args(path, "--no-cache"),
        env={
            "FDL_FIXTURE_BUILD_SLEEP": str(BUILD_SLEEP),
            "INVOKE_FDL_WARM_CONTAINERS": "0",  # a container per build (warm: test_warm.py)
        },
    )
    run.wait_for(lambda: "(run " in run.stderr and run.stderr.count(" started") == 2, timeout=90)
    run_id = run.stderr.split("(run ", 1)[1].split(":", 1)[0]
    label = f"fdl-tasks.run={run_id}"
    run.wait_for(lambda: len(containers(label)) == 2, timeout=60)
    run.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    deadline = signalled + STOP_BUDGET
    while time.monotonic() < deadline and (run.process.poll() is None or containers(label)):
        time.sleep(0.2)
    code, left, checked = run.process.poll(), containers(label), time.monotonic()
    state = "still running" if code is None else f"exited {code}"
    problem = (
        f"{checked - signalled:.1f}s after SIGTERM: inv {state}, {len(left)} container(s) left"
    )
    if code is None or left:  # fail now, without waiting out the builds
        run.process.kill()
        remove_containers(label)
    assert code == 130 and not left, f"{problem}\n{run.stderr}"  # 130: stopped, not failed
    # Each build started after inv did, so none could have ended on its own by now.
    assert checked < run.started + BUILD_SLEEP, f"checked too late to tell: {problem}"
    run.finish()
    assert "interrupted: every build of this run was stopped; no envelope was published" in (
        run.stderr
    )
    assert "Traceback" not in run.stderr
    assert not (rig.project / "target/cluster/_envelopes/ddp-bench.json").exists()


def test_a_compose_no_op_starts_no_container_and_a_service_change_runs_cargo(
    rig: RigCluster,
) -> None:
    """The record's identity is the service as compose resolves it, with its image's id: an
    unchanged one starts nothing, a changed one (a variable of its environment) runs cargo.
    A source saved in the build's own second is rebuilt either way (its content decides)."""
    path = flodl_cluster_file(rig)
    built = rig.inv(*prebuild_args(path))
    assert built.returncode == 0, built.stderr
    shim, calls = docker_calls(rig, "compose-noop")
    noop = rig.inv(*prebuild_args(path), env=shim)
    assert noop.returncode == 0, noop.stderr
    assert not [c for c in calls.read_text().splitlines() if " run " in f" {c}"], calls.read_text()
    assert "cargo not started" in noop.stderr and "Compiling" not in noop.stderr

    compose = rig.project / "docker-compose.yml"
    original = compose.read_text()
    try:
        data = yaml.safe_load(original)
        for service in data["services"].values():
            service["environment"]["FDL_NOTE"] = "x"
        compose.write_text(yaml.safe_dump(data, sort_keys=False))
        changed = rig.inv(*prebuild_args(path), env=shim)
        assert changed.returncode == 0, changed.stderr
        assert "cargo not started" not in changed.stderr
    finally:
        compose.write_text(original)

    main = rig.project / "ddp-bench/src/main.rs"
    text = main.read_text()
    stamp = main.stat().st_mtime_ns
    try:
        main.write_text(text.replace('cuda={cuda}");', 'cuda={cuda} saved=again");'))
        os.utime(main, ns=(stamp, stamp))  # cargo's mtime rule calls it fresh
        again = rig.inv(*prebuild_args(path))
        assert again.returncode == 0, again.stderr
        envelope = decode(
            (rig.project / "target/cluster/_envelopes/ddp-bench.json").read_text(), "e"
        )
        entry = envelope["pascal"]
        assert rig.run_on_host("pascal", str(rig.project), entry).endswith("saved=again")
    finally:
        main.write_text(text)
