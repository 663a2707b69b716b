"""Stopping a prebuild and surviving faults, each on the rig with real processes.

Builds are made to last (the fixture's build.rs sleeps for
``FDL_FIXTURE_BUILD_SLEEP`` seconds) so that there is a build in flight to
interrupt, kill or race against.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from fdl_tasks.build.docker_tools import remove_containers
from fdl_tasks.publish.envelope import decode
from rig.faults import kill_sshd
from rig.harness import RigCluster, Running, containers, inv_argv, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("alpha", "127.0.0.70"),
    HostSpec("beta", "127.0.0.71"),
    HostSpec("gamma", "127.0.0.72"),
]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"
#: These tests need several builds in flight at once; with the compile cache the
#: first build runs alone (so that the others can hit), which is not what they test.
#: A container per build (not warm: test_warm.py holds warm containers to these guarantees).
COLD = {"INVOKE_FDL_WARM_CONTAINERS": "0"}
PARALLEL = {"INVOKE_FDL_COMPILE_CACHE": "0", **COLD}
#: Seconds the interrupted builds would last: far beyond :data:`STOP_BUDGET`, so that
#: only a real stop (not builds ending on their own) can meet that budget.
BUILD_SLEEP = 120
#: Seconds from the signal by which ``inv`` must have exited with no container left.
STOP_BUDGET = 10


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("faults"), HOSTS, VARIANTS, docker=True) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def fresh_targets(rig: RigCluster) -> Iterator[None]:
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    for host in HOSTS:
        rig.rig.start_host(host.name)
    yield


def cluster(rig: RigCluster, name: str, docker: bool, sleep: float = 0) -> Path:
    archs = dict(zip([h.name for h in HOSTS], VARIANTS, strict=True))
    workers = [rig.worker(h, arch=a) for h, a in archs.items()]
    controller: dict[str, Any] = {}
    if docker:
        settings = rig.docker_settings()
        settings["env"] = {"FDL_FIXTURE_BUILD_SLEEP": str(sleep)}
        controller["docker"] = settings
    return rig.write(workers, name, **controller)


def run_containers(run: Running, running: bool = False) -> list[str]:
    """The containers of that run (other runs may share the daemon)."""
    match = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    if match is None:
        return []
    return containers(f"fdl-tasks.run={match.group(1)}", running=running)


def build_processes(project: Path) -> list[str]:
    """cargo and build scripts working on this rig's project (not other builds on the machine)."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        argv = " ".join(process.info["cmdline"] or []).strip()
        cwd = process.info["cwd"] or ""
        ours = str(project) in argv or cwd.startswith(str(project))
        if ours and ("build-script-build" in argv or argv.startswith("cargo build --release")):
            found.append(argv)
    return found


def run_label(run: Running) -> str:
    """The label every container of that run carries, from its start line."""
    match = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    assert match is not None, run.stderr
    return f"fdl-tasks.run={match.group(1)}"


def assert_stopped_in_time(run: Running, label: str, signalled: float, build_end: float) -> int:
    """``inv`` has exited and no container with ``label`` is left, within :data:`STOP_BUDGET`
    seconds of ``signalled`` and before ``build_end``, when no build could have ended on its own.

    A run still there is killed and its containers removed before the assertion
    fails, so a failure does not wait out the build either.
    """
    deadline = signalled + STOP_BUDGET
    while time.monotonic() < deadline:
        if run.process.poll() is not None and not containers(label):
            break
        time.sleep(0.2)
    code, left, checked = run.process.poll(), containers(label), time.monotonic()
    state = "still running" if code is None else f"exited {code}"
    problem = (
        f"{checked - signalled:.1f}s after the signal: inv {state}, "
        f"{len(left)} container(s) labelled {label} left"
    )
    if code is None or left:
        run.process.kill()
        remove_containers(label)
    assert code is not None and not left, f"{problem}\n{run.stderr}"
    assert checked < build_end, f"checked too late to tell a stop from a finished build: {problem}"
    return code


def test_sigint_stops_every_build_container(rig: RigCluster) -> None:
    path = cluster(rig, "int.yaml", docker=True, sleep=BUILD_SLEEP)
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env=PARALLEL
    )
    run.wait_for(lambda: len(run_containers(run, running=True)) >= 2)
    label = run_label(run)
    run.process.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    # No build can end on its own before this: each started after inv did.
    build_end = run.started + BUILD_SLEEP
    assert assert_stopped_in_time(run, label, signalled, build_end) == 130  # stopped, not failed
    run.finish()
    assert "interrupted: every build of this run was stopped" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (rig.project / ENVELOPE).exists()


def test_sigterm_stops_native_cargo_and_its_children(rig: RigCluster) -> None:
    path = cluster(rig, "term.yaml", docker=False)
    run = rig.background(*prebuild_args(path), env={**PARALLEL, "FDL_FIXTURE_BUILD_SLEEP": "60"})
    run.wait_for(lambda: len(build_processes(rig.project)) >= 2)
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() != 0
    assert "interrupted" in run.stderr
    deadline = time.monotonic() + 10
    while build_processes(rig.project) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert build_processes(rig.project) == []
    assert not (rig.project / ENVELOPE).exists()


def test_container_killed_from_outside_fails_that_build_only(rig: RigCluster) -> None:
    path = cluster(rig, "kill.yaml", docker=True, sleep=6)
    run = rig.background(*prebuild_args(path, "--jobs", "3", "--per-host", "--no-cache"), env=COLD)
    run.wait_for(lambda: len(run_containers(run, running=True)) >= 3)
    run_id = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    assert run_id is not None
    victim = containers("fdl-tasks.job=beta", f"fdl-tasks.run={run_id.group(1)}", running=True)
    assert victim, run.stderr
    subprocess.run(["docker", "kill", victim[0]], check=True, capture_output=True)
    assert run.finish() == 1
    assert "1 of 3 build(s) failed" in run.stderr
    assert "cargo exited 137" in run.stderr
    assert "build beta for beta failed" in run.stderr
    assert "prebuild: cu128 (alpha) ok" in run.stderr
    assert "prebuild: cpu (gamma) ok" in run.stderr
    assert run_containers(run) == []
    assert not (rig.project / ENVELOPE).exists()


def test_docker_daemon_unreachable_fails_before_any_build(rig: RigCluster) -> None:
    path = cluster(rig, "nodaemon.yaml", docker=True)
    done = rig.inv(*prebuild_args(path), env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert done.returncode == 1
    assert "the Docker daemon does not answer" in done.stderr
    assert "build(s)" not in done.stderr and "Traceback" not in done.stderr


def test_target_tree_not_writable(rig: RigCluster) -> None:
    (rig.project / "target").mkdir()
    (rig.project / "target/cluster").write_text("a file where the tree should be")
    done = rig.inv(*prebuild_args(cluster(rig, "ro.yaml", docker=False)))
    assert done.returncode == 1
    assert "the target tree is not writable" in done.stderr
    assert "Traceback" not in done.stderr


def test_two_prebuilds_at_once_both_finish(rig: RigCluster, tmp_path: Path) -> None:
    """The second waits for the first and never interleaves: its builds start only
    after the first published.

    Both write stderr to one file opened for appending, so the file's line order is
    the order in which the two processes wrote. (Two pipes read by two threads would
    not say which line was written first: the threads can be scheduled either way.)
    """
    path = cluster(rig, "twice.yaml", docker=False)
    argv = inv_argv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    env = rig.environment({"FDL_FIXTURE_BUILD_SLEEP": "3"})
    log = tmp_path / "both.log"
    with log.open("a") as shared, contextlib.ExitStack() as running:

        def start() -> subprocess.Popen[bytes]:
            process = subprocess.Popen(
                argv, cwd=rig.root, env=env, stdout=subprocess.DEVNULL, stderr=shared
            )
            running.callback(process.kill)
            return process

        first = start()
        deadline = time.monotonic() + 60
        while "build(s) with" not in log.read_text():
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        second = start()
        assert (first.wait(timeout=120), second.wait(timeout=120)) == (0, 0), log.read_text()
    written = log.read_text()
    assert "waiting for the prebuild already running on this project" in written
    steps = [
        step
        for line in written.splitlines()
        for step in ("build(s) with", "written to")
        if step in line
    ]
    assert steps == ["build(s) with", "written to"] * 2, written
    envelopes = decode((rig.project / ENVELOPE).read_text(), "envelope")
    assert sorted(envelopes) == ["alpha", "beta", "gamma"]


def test_host_disappearing_before_verification_is_a_warning(rig: RigCluster) -> None:
    path = cluster(rig, "vanish.yaml", docker=False)
    run = rig.background(*prebuild_args(path), env={"FDL_FIXTURE_BUILD_SLEEP": "3"})
    run.wait_for(lambda: "build(s)" in run.stderr)
    rig.rig.stop_host("beta")
    assert run.finish() == 0, run.stderr
    assert "verify: beta not verified:" in run.stderr
    assert (
        "verify: 2 host(s) verified (same bytes, every library resolves), 1 not verified: beta ("
        in run.stderr
    )


def test_sshd_killed_mid_probe_is_a_warning(rig: RigCluster) -> None:
    slow = rig.rig.host_dir("gamma") / "bin" / "uname"
    original = slow.read_text() if slow.exists() else None
    in_flight = rig.root / "gamma-probe-in-flight"
    in_flight.unlink(missing_ok=True)
    slow.write_text(f'#!/bin/sh\ntouch {in_flight}\nsleep 30\nexec /bin/uname "$@"\n')
    slow.chmod(0o755)
    try:
        path = cluster(rig, "midprobe.yaml", docker=False)
        run = rig.background("preflight", "--cluster-file", str(path))
        run.wait_for(in_flight.exists, timeout=60)  # the probe is running on gamma
        started = time.monotonic()
        kill_sshd(rig.rig.host_dir("gamma") / "sshd_config")
        assert run.finish() == 0, run.stderr
        assert time.monotonic() - started < 15
        assert "warning  gamma:" in run.stderr
        assert "ok       alpha" in run.stderr and "Traceback" not in run.stderr
    finally:
        if original is None:
            slow.unlink()
        else:
            slow.write_text(original)
        rig.rig.stop_host("gamma")  # reaps the orphaned session processes too


def test_live_status_line_on_a_real_terminal(rig: RigCluster) -> None:
    """stderr on a pseudo-terminal: each build's live line is drawn (rich's codes),
    redrawn, and gone once the last result is said."""
    path = cluster(rig, "tty.yaml", docker=False)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        inv_argv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path)),
        cwd=rig.root,
        env=rig.environment({"FDL_FIXTURE_BUILD_SLEEP": "2"}),
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
    )
    os.close(terminal)
    seen = b""
    with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
        while chunk := os.read(controller, 4096):
            seen += chunk
    os.close(controller)
    assert process.wait(timeout=60) == 0
    text = seen.decode()
    for title in ("cu128 (alpha)", "cu126 (beta)", "cpu (gamma)"):
        bar = rf"{re.escape(title)} +(\x1b\[[0-9;]*m)?━"  # its live line: label, then bar
        assert re.search(bar, text), title
        assert f"prebuild: {title} ok in " in text
        assert f"prebuild: {title} started" not in text  # plain lines are for pipes only
    assert text.count("\x1b[2K") > 2  # rich erases and redraws the live lines
    assert text.rindex("━") < text.rindex(" ok in ")  # none left after the last result
