"""Warm build containers through the real ``inv``: real sshd hosts, real Docker, real cargo.

One long-lived container per build's ``docker run`` options; each build a
``docker exec`` in it. The tests hold it to its guarantees: the same bytes as a
container per build, a changed image replaces it, a stop kills the build inside
it, ``inv clean`` removes it, it stops itself when idle, and a daemon restart
between two prebuilds starts a new one and says so.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.build.docker_tools import remove_containers
from fdl_tasks.build.parked_standbys import park_dir
from fdl_tasks.build.warm_containers import PARK_MOUNT, WARM_IMAGE_LABEL, WARM_LABEL
from fdl_tasks.core.binary_files import file_sha256
from fdl_tasks.publish.envelope import decode
from rig.docker_builder import BUILDER_IMAGE
from rig.faults import PrivateDockerd, private_dockerd
from rig.harness import RigCluster, Running, containers, prebuild_args, start_rig
from rig.project import write_compose_file
from rig.sshrig import HostSpec
from tests.rig.test_everyday import docker_calls
from tests.rig.test_watch import set_rev

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec("wa", "127.0.0.10"), HostSpec("wb", "127.0.0.11"), HostSpec("wc", "127.0.0.12")]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"
#: An image of this test's own, so that changing it touches nobody else's builds.
TEST_IMAGE = "fdl-warm-test"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("warm"), HOSTS, VARIANTS, docker=True) as cluster:
        try:
            yield cluster
        finally:
            remove_containers(f"{WARM_LABEL}={cluster.project}")


def warm(rig: RigCluster, *, running: bool = True) -> list[str]:
    """This project's warm containers."""
    return containers(f"{WARM_LABEL}={rig.project}", running=running)


def cluster_file(rig: RigCluster, name: str, **docker: object) -> Path:
    workers = [rig.worker(h.name, arch=a) for h, a in zip(HOSTS, VARIANTS, strict=True)]
    return rig.write(workers, name, docker={**rig.docker_settings(), **docker})


def binaries(rig: RigCluster) -> dict[str, str]:
    """Each host's published binary's sha256."""
    import json

    envelope = json.loads((rig.project / ENVELOPE).read_text())
    return {host: file_sha256(rig.project / entry["bin"]) for host, entry in envelope.items()}


def processes(name: str) -> list[str]:
    """The command lines running in a container (``/proc``: the image has no ``ps``)."""
    script = "for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p; echo; done"
    done = subprocess.run(
        ["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True, check=True
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def test_warm_builds_are_byte_identical_to_cold_ones(rig: RigCluster) -> None:
    """From an empty target tree each time: warm (the default) then ``--no-warm``; the same
    bytes for every host, and the warm run left one running container per build."""
    path = cluster_file(rig, "bytes.yaml")
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    done = rig.inv(*prebuild_args(path, "--no-cache"))
    assert done.returncode == 0, done.stderr
    warm_bytes = binaries(rig)
    assert len(warm(rig)) == 3, done.stderr
    assert "each a docker exec in a warm container labelled" in done.stderr
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    done = rig.inv(*prebuild_args(path, "--no-cache", "--no-warm"))
    assert done.returncode == 0, done.stderr
    assert "each a docker exec" not in done.stderr
    assert binaries(rig) == warm_bytes
    # and an edit then a warm build again: the exec reuses the containers
    before = set(warm(rig))
    edit(rig)
    done = rig.inv(*prebuild_args(path, "--no-cache"))
    assert done.returncode == 0, done.stderr
    assert set(warm(rig)) == before


def test_an_image_change_replaces_the_container(rig: RigCluster) -> None:
    def tag(text: str) -> str:
        dockerfile = f"FROM {BUILDER_IMAGE}:12.8\nLABEL fdl-warm-test={text}\n"
        subprocess.run(
            ["docker", "build", "-q", "-t", TEST_IMAGE, "-"],
            input=dockerfile,
            text=True,
            capture_output=True,
            check=True,
        )
        found = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", TEST_IMAGE],
            capture_output=True,
            text=True,
            check=True,
        )
        return found.stdout.strip()

    remove_containers(f"{WARM_LABEL}={rig.project}")
    try:
        first = tag("one")
        path = cluster_file(rig, "image.yaml", image=TEST_IMAGE)
        done = rig.inv(*prebuild_args(path))
        assert done.returncode == 0, done.stderr
        old = warm(rig)
        second = tag("two")
        assert second != first
        done = rig.inv(*prebuild_args(path))
        assert done.returncode == 0, done.stderr
        assert "replacing the build container of" in done.stderr
        assert "its image changed" in done.stderr
        new = warm(rig, running=False)
        assert not set(old) & set(new)
        images = subprocess.run(
            ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{WARM_IMAGE_LABEL}"}}}}', *new],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert set(images) == {second}
    finally:
        remove_containers(f"{WARM_LABEL}={rig.project}")
        subprocess.run(["docker", "rmi", "-f", TEST_IMAGE], capture_output=True)


def test_ctrl_c_kills_the_build_inside_the_container(rig: RigCluster) -> None:
    """The build scripts sleep; Ctrl-C: exit 130, nothing of the build left running in the
    containers, which stay warm for the next build."""
    path = cluster_file(rig, "int.yaml", env={"FDL_FIXTURE_BUILD_SLEEP": "120"})
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    run = rig.background(*prebuild_args(path, "--jobs", "3", "--no-cache"))

    def building() -> list[str]:
        return [n for n in warm(rig) if any("cargo" in p for p in processes(n))]

    run.wait_for(lambda: len(building()) == 3, timeout=180)
    run.process.send_signal(signal.SIGINT)
    assert run.finish(timeout=60) == 130, run.stderr
    assert "interrupted: every build of this run was stopped" in run.stderr
    names = warm(rig)
    assert len(names) == 3
    for name in names:
        left = [p for p in processes(name) if re.search(r"cargo|rustc|build-script", p)]
        assert left == [], (name, left)


def test_clean_leaves_no_container(rig: RigCluster) -> None:
    path = cluster_file(rig, "clean.yaml")
    edit(rig)
    done = rig.inv(*prebuild_args(path))
    assert done.returncode == 0, done.stderr
    assert warm(rig)
    assert park_dir(str(rig.project)).is_dir()
    done = rig.inv("clean", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert warm(rig, running=False) == []
    assert not park_dir(str(rig.project)).exists()  # nor a standby parked in one


def edit(rig: RigCluster) -> None:
    """A change to the command's sources: every build runs cargo."""
    main = rig.project / "ddp-bench/src/main.rs"
    main.write_text(main.read_text() + "\n// edited\n")


def test_idle_timeout_stops_the_container_with_no_inv_alive(rig: RigCluster) -> None:
    path = cluster_file(rig, "idle.yaml")
    edit(rig)
    done = rig.inv(*prebuild_args(path), env={"INVOKE_FDL_WARM_IDLE": "10"})
    assert done.returncode == 0, done.stderr
    assert len(warm(rig)) == 3
    for name in warm(rig):  # a standby parked in each, waiting: no work for the keeper
        parked_when_ready(name)
    deadline = time.monotonic() + 40
    while warm(rig, running=False) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert warm(rig, running=False) == []  # stopped itself, then removed (--rm)


@pytest.fixture(scope="module")
def dockerd() -> Iterator[PrivateDockerd]:
    """A daemon of this module's own (as ``test_docker_restart.py``): restarting it touches
    no other run's containers."""
    with private_dockerd() as daemon:
        yield daemon


def test_a_daemon_restart_between_two_prebuilds(rig: RigCluster, dockerd: PrivateDockerd) -> None:
    """The second prebuild finds its containers gone, says so, starts new ones, publishes."""
    path = cluster_file(rig, "restart.yaml")
    env = {"DOCKER_HOST": dockerd.host}

    def running() -> list[str]:
        found = dockerd.docker("ps", "-q", "--filter", f"label={WARM_LABEL}={rig.project}")
        return found.stdout.split()

    edit(rig)
    done = rig.inv(*prebuild_args(path), env=env)
    assert done.returncode == 0, done.stderr
    first = running()
    assert len(first) == 3, done.stderr
    dockerd.restart()
    edit(rig)
    done = rig.inv(*prebuild_args(path), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("the Docker daemon restarted, or it was stopped or removed") == 3
    assert ": starting a new one" in done.stderr
    second = running()
    assert len(second) == 3 and not set(first) & set(second)


def test_a_stop_of_watch_removes_its_containers(rig: RigCluster) -> None:
    path = cluster_file(rig, "watch.yaml")
    edit(rig)
    (rig.project / ENVELOPE).unlink(missing_ok=True)
    run = rig.background(*prebuild_args(path, "--watch"))
    run.wait_for(lambda: (rig.project / ENVELOPE).exists(), timeout=180)  # cycle 1 published
    assert len(warm(rig)) == 3
    run.process.send_signal(signal.SIGINT)
    assert run.finish(timeout=60) == 130, run.stderr
    assert warm(rig, running=False) == []
    # The next prebuild starts new ones and blames no one for the ones the watch removed.
    edit(rig)
    done = rig.inv(*prebuild_args(path))
    assert done.returncode == 0, done.stderr
    assert "is gone" not in done.stderr and len(warm(rig)) == 3


def test_compose_builds_are_warm_too_and_byte_identical(rig: RigCluster) -> None:
    """flodl's compose services: a ``compose run -d`` container per build environment, each
    build a ``docker exec`` in it; the same bytes as ``compose run --rm``; clean removes them."""
    write_compose_file(rig.project)
    workers = [rig.worker(h.name, arch=a) for h, a in zip(HOSTS, VARIANTS, strict=True)]
    path = rig.write(workers, "compose.yaml", docker="cuda")
    remove_containers(f"{WARM_LABEL}={rig.project}")
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    done = rig.inv(*prebuild_args(path))
    assert done.returncode == 0, done.stderr
    assert len(warm(rig)) == 3, done.stderr
    warm_bytes = binaries(rig)
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    done = rig.inv(*prebuild_args(path, "--no-warm"))
    assert done.returncode == 0, done.stderr
    assert binaries(rig) == warm_bytes
    assert park_dir(str(rig.project)).is_dir()
    done = rig.inv("clean", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert warm(rig, running=False) == []
    assert not park_dir(str(rig.project)).exists()  # nor a standby parked in one


def test_a_timeout_kills_the_build_inside_the_container(rig: RigCluster) -> None:
    """One build's timeout: that build fails, named; nothing of it left in its container."""
    path = cluster_file(rig, "timeout.yaml", env={"FDL_FIXTURE_BUILD_SLEEP": "120"})
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    done = rig.inv(*prebuild_args(path, "--no-cache", "--timeout", "15"), timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("timed out after 15s") >= 3, done.stderr
    names = warm(rig)
    assert len(names) == 3, done.stderr
    for name in names:
        left = [p for p in processes(name) if re.search(r"cargo|rustc|build-script", p)]
        assert left == [], (name, left)


def standbys(name: str) -> list[str]:
    """The pids of the docker execs waiting in a container for a build (``STANDBY``)."""
    script = (
        "for p in /proc/[0-9]*; do [ ${p#/proc/} = $$ ] && continue; "
        "grep -q 'argv=.(cat)' $p/cmdline 2>/dev/null && echo ${p#/proc/}; done; true"
    )
    done = subprocess.run(
        ["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True, check=True
    )
    return sorted(done.stdout.split())


def standby_clients(ids: list[str]) -> list[str]:
    """The pids of this machine's ``docker exec -i`` clients of standbys in these containers."""
    inspected = ["docker", "inspect", "--format", "{{.Name}}", *ids]
    done = subprocess.run(inspected, capture_output=True, text=True, check=True)
    names = [name.lstrip("/") for name in done.stdout.split()]
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # ended meanwhile
        if argv[:3] == ["docker", "exec", "-i"] and len(argv) > 3 and argv[3] in names:
            found.append(cmdline.parent.name)
    return found


def revs_published(rig: RigCluster) -> set[str]:
    """What every host's published binary prints after ``rev=``, run over its own sshd."""
    envelopes = decode((rig.project / ENVELOPE).read_text(), "envelope")
    return {
        rig.run_on_host(host, str(rig.project), entry).rsplit("rev=", 1)[-1]
        for host, entry in envelopes.items()
    }


def test_a_watch_cycle_builds_in_the_docker_exec_the_last_one_left_waiting(rig: RigCluster) -> None:
    """After each cycle, a watch leaves a docker exec waiting in each warm container; the
    next cycle's build runs in it (the waiting process becomes the build: gone after it,
    a new one waiting), and every host runs the edit. One killed by hand is no harm: the
    build runs as a docker exec of its own, also when the kill comes in the moment
    between the build being handed to it and it running it (its docker client, stopped
    here, only learns then). A stop leaves neither container nor exec."""
    path = cluster_file(rig, "standby.yaml")
    (rig.project / ENVELOPE).unlink(missing_ok=True)
    set_rev(rig, "s0")
    run = rig.background(*prebuild_args(path, "--watch"))
    try:
        done = 1
        run.wait_for(lambda: cycle_ok(run, done), timeout=180)
        names = warm(rig)
        assert len(names) == 3
        run.wait_for(lambda: all(len(standbys(n)) == 1 for n in names), timeout=60)
        for rev in ("s1", "s2", "s3"):
            before = {n: standbys(n) for n in names}
            clients = standby_clients(names)
            if rev == "s3":  # their docker clients learn of the kill only once handed a build
                assert len(clients) == 3
                for pid in clients:
                    os.kill(int(pid), signal.SIGSTOP)
                logs = build_logs(rig)
            if rev == "s2":  # killed by hand: the cycle's builds run as docker execs
                assert len(standby_clients(names)) == 3
                for name, pids in before.items():
                    kill = ["sh", "-c", 'kill -KILL "$@"', "sh", *pids]
                    subprocess.run(["docker", "exec", name, *kill], check=True)
                # Until their docker clients, told by the daemon, have ended: a build
                # handed to one before that is killed with it (exit 137), as it says.
                deadline = time.monotonic() + 30
                while standby_clients(names) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert standby_clients(names) == []
            if rev == "s3":
                for name, pids in before.items():
                    kill = ["sh", "-c", 'kill -KILL "$@"', "sh", *pids]
                    subprocess.run(["docker", "exec", name, *kill], check=True)
            set_rev(rig, rev)
            done += 1
            if rev == "s3":  # each build has opened its log, then is handed to a client
                run.wait_for(functools.partial(rewritten, rig, logs), timeout=120)
                time.sleep(3)
                for pid in clients:
                    os.kill(int(pid), signal.SIGCONT)
            run.wait_for(functools.partial(cycle_ok, run, done), timeout=120)
            if rev == "s3":
                lost = "ended (exit 137) before the build began: the build runs in a docker exec"
                assert all(lost in Path(p).read_text() for p in logs), logs
            assert revs_published(rig) == {rev}
            assert warm(rig) == names
            run.wait_for(lambda: all(len(standbys(n)) == 1 for n in names), timeout=60)
            assert all(standbys(n) != before[n] for n in names)
        run.process.send_signal(signal.SIGINT)
        assert run.finish(timeout=60) == 130, run.stderr
        assert warm(rig, running=False) == []
    finally:
        set_rev(rig, "0")


def build_logs(rig: RigCluster) -> dict[str, int]:
    """Each build log of the project, by its inode and modification time (a build opens
    its log afresh as it begins)."""
    found = (rig.project / "target/cluster").glob("**/build-ddp-bench.log")
    return {str(p): hash((p.stat().st_ino, p.stat().st_mtime_ns)) for p in found}


def rewritten(rig: RigCluster, logs: dict[str, int]) -> bool:
    """Whether every one of these build logs was opened afresh since."""
    now = build_logs(rig)
    return all(now.get(path) != seen for path, seen in logs.items())


def built_binaries(rig: RigCluster) -> dict[str, str]:
    """Each shared target dir's binary, by its sha256 (what cargo last wrote)."""
    found = (rig.project / "target/cluster/_shared").glob("*/release/ddp-bench")
    return {str(path): file_sha256(path) for path in found}


def test_a_prebuild_runs_its_builds_in_docker_execs_started_ahead(rig: RigCluster) -> None:
    """A prebuild that succeeded parks a docker exec in each warm container it built in;
    after an edit, the next prebuild's builds run in those (no docker exec runs a build,
    none starts beside preflight), every host runs the edit, and new ones are parked.
    When preflight fails, the parked ones stay as they were. Where none is parked, the
    prebuild starts one in each container beside preflight (its looks say its builds will
    run); when preflight then fails, they end having run nothing. Either way no cargo
    wrote a binary."""
    path = cluster_file(rig, "ahead.yaml")
    try:
        prebuilds_in_standbys(rig, path)
    finally:
        set_rev(rig, "0")


def prebuilds_in_standbys(rig: RigCluster, path: Path) -> None:
    set_rev(rig, "a0")
    assert rig.inv(*prebuild_args(path)).returncode == 0
    names = warm(rig)
    assert len(names) == 3
    first = {name: parked_when_ready(name) for name in names}
    env, calls = docker_calls(rig, "ahead")
    set_rev(rig, "a1")
    done = rig.inv(*prebuild_args(path), env=env)
    assert done.returncode == 0, done.stderr
    again = {name: parked_when_ready(name) for name in names}  # parked once inv has ended
    assert all(again[n] != first[n] for n in names)  # each used, another one parked
    execs = [line.split() for line in calls.read_text().splitlines() if line.startswith("exec ")]
    assert [e for e in execs if e[1] != "-d"] == []  # the builds ran in the parked ones
    assert sorted(e[2] for e in execs) == sorted(container_name(n) for n in names), execs
    assert revs_published(rig) == {"a1"}
    assert all(standbys(n) == [] for n in names)
    # a host whose declared data path is missing: preflight fails after the looks
    workers = [rig.worker(h.name, arch=a) for h, a in zip(HOSTS, VARIANTS, strict=True)]
    workers[0]["data_path"] = str(rig.root / "no-such-data")
    failing = rig.write(workers, "ahead-fails.yaml", docker=rig.docker_settings())
    before = built_binaries(rig)
    calls.write_text("")
    set_rev(rig, "a2")
    done = rig.inv(*prebuild_args(failing), env=env)
    assert done.returncode != 0 and "preflight found errors" in done.stderr, done.stderr
    assert "exec " not in calls.read_text()
    assert {name: parked(name) for name in names} == again
    # none parked (the shells and their directories gone): standbys beside preflight
    for name in names:
        kill = ["docker", "exec", name, "sh", "-c", 'kill -9 "$@"', "sh", *again[name]]
        subprocess.run(kill, check=True)
        shutil.rmtree(park_dir(str(rig.project)) / container_name(name))
    done = rig.inv(*prebuild_args(failing), env=env)
    assert done.returncode != 0 and "preflight found errors" in done.stderr, done.stderr
    started = [line for line in calls.read_text().splitlines() if line.startswith("exec -i ")]
    assert len(started) == 3, calls.read_text()
    assert built_binaries(rig) == before
    assert all(standbys(n) == [] and parked(n) == [] for n in names)
    assert revs_published(rig) == {"a1"}


def parked(name: str) -> list[str]:
    """The pids of the shells parked in a container (``PARK``: they wait in its mount)."""
    script = (
        "for p in /proc/[0-9]*; do [ ${p#/proc/} = $$ ] && continue; "
        f"[ $p/cwd -ef {PARK_MOUNT} ] && grep -q argv= $p/cmdline && echo ${{p#/proc/}}; "
        "done; true"
    )
    done = subprocess.run(
        ["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True, check=True
    )
    return sorted(done.stdout.split())


def parked_when_ready(name: str) -> list[str]:
    """The one shell parked in a container, once its ``docker exec -d`` has started it."""
    deadline = time.monotonic() + 30
    while len(found := parked(name)) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(found) == 1, (name, found)
    return found


def container_name(name_or_id: str) -> str:
    """A container's name (``docker ps`` gives ids)."""
    inspected = ["docker", "inspect", "-f", "{{.Name}}", name_or_id]
    done = subprocess.run(inspected, capture_output=True, text=True, check=True)
    return done.stdout.strip().lstrip("/")


def cycle_ok(run: Running, number: int) -> bool:
    return any(line.startswith(f"watch: cycle {number} ok") for _, line in list(run.lines))
