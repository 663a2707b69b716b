"""The one publish path on the rig: a racing build-host, a malformed envelope, a stop that
cannot remove a container, a run killed while publishing.

Real sshd hosts, real native cargo and real docker. Builds are made to last (the
fixture's build.rs sleeps for ``FDL_FIXTURE_BUILD_SLEEP`` seconds) so that one run
is inside the project lock when the other arrives; verification is held at its last
step (a ``sha256sum`` shim on the host, :func:`rig.faults.held_verification`) to
kill a run right before it publishes.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.config.layout import host_binary
from fdl_tasks.publish.envelope import decode
from rig.faults import held_verification, unremovable
from rig.harness import RigCluster, Running, containers, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig]

HOSTS = [
    HostSpec("alpha", "127.0.0.205"),
    HostSpec("beta", "127.0.0.206"),
    HostSpec("gamma", "127.0.0.207"),
]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"
WAITING = "waiting for the prebuild already running on this project"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("publish"), HOSTS, VARIANTS, docker=True) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def fresh_targets(rig: RigCluster) -> None:
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)


def cluster(rig: RigCluster, name: str, docker: bool = False, sleep: float = 0) -> Path:
    archs = dict(zip([h.name for h in HOSTS], VARIANTS, strict=True))
    controller: dict[str, Any] = {}
    if docker:
        controller["docker"] = {
            **rig.docker_settings(),
            "env": {"FDL_FIXTURE_BUILD_SLEEP": str(sleep)},
        }
    return rig.write([rig.worker(h, arch=a) for h, a in archs.items()], name, **controller)


def published(rig: RigCluster) -> list[str]:
    return sorted(decode((rig.project / ENVELOPE).read_text(), ENVELOPE))


def build_host(path: Path, host: str) -> list[str]:
    return ["build-host", "--host", host, "--cmd", "ddp-bench", "--cluster-file", str(path)]


#: A container per build (not warm: test_warm.py holds warm containers to these guarantees).
COLD = {"INVOKE_FDL_WARM_CONTAINERS": "0"}


def run_label(run: Running) -> str:
    """The label of every container of that run, from its start line."""
    run.wait_for(lambda: "(run " in run.stderr)
    found = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    assert found is not None, run.stderr
    return f"fdl-tasks.run={found.group(1)}"


def running_container(run: Running) -> tuple[str, str]:
    """One running build container of that run: its id and its name."""
    label = run_label(run)
    run.wait_for(lambda: bool(containers(label, running=True)))
    victim = containers(label, running=True)[0]
    name = subprocess.run(
        ["docker", "inspect", "-f", "{{.Name}}", victim], capture_output=True, text=True
    ).stdout.strip("/\n")
    return victim, name


def test_build_host_racing_prebuild_loses_no_entry(rig: RigCluster) -> None:
    """build-host arrives while prebuild holds the lock (held there, verifying gamma): it
    merges into what prebuild published, not into what was there before it waited
    (nothing: it would publish beta alone)."""
    path = cluster(rig, "race.yaml")
    with held_verification(rig.rig, "gamma", rig.root) as (started, go):
        first = rig.background(*prebuild_args(path), env={})
        first.wait_for(started.exists, timeout=120)  # inside the lock
        second = rig.background(*build_host(path, "beta"), env={})
        second.wait_for(lambda: WAITING in second.stderr, timeout=120)
        go.touch()
        assert first.finish() == 0, first.stderr
    assert second.finish() == 0, second.stderr
    assert published(rig) == ["alpha", "beta", "gamma"], second.stderr
    written = f"envelope of ddp-bench for 3 host(s) written to {rig.project / ENVELOPE}"
    assert f"prebuild: {written}" in first.stderr
    assert f"build-host: {written}" in second.stderr  # the same report for both


def test_malformed_envelope_is_never_silently_replaced(rig: RigCluster) -> None:
    """build-host would keep alpha's and gamma's entries from it: an error naming the file,
    nothing built, the file untouched. prebuild rebuilds every entry: it replaces it, saying so."""
    path = cluster(rig, "malformed.yaml")
    target = rig.project / ENVELOPE
    target.parent.mkdir(parents=True)
    target.write_text('{"alpha": {"bin": 3}}\n')
    done = rig.inv(*build_host(path, "beta"))
    assert done.returncode == 1, done.stderr
    assert f"fdl: {target}: a malformed prebuild envelope" in done.stderr
    assert f"fix or remove {target}" in done.stderr
    assert "build(s) with" not in done.stderr and "Traceback" not in done.stderr
    assert target.read_text() == '{"alpha": {"bin": 3}}\n'
    done = rig.inv(*prebuild_args(path))
    assert done.returncode == 0, done.stderr
    assert "prebuild: the published envelope cannot be read, replacing it:" in done.stderr
    assert published(rig) == ["alpha", "beta", "gamma"]


@pytest.mark.docker
def test_container_that_refuses_removal_is_named(rig: RigCluster) -> None:
    """Ctrl-C; the daemon refuses to remove one build container (a real refusal:
    :func:`rig.faults.unremovable`). The run names it with the command that removes
    it and exits 3, not 130: it did not stop cleanly."""
    path = cluster(rig, "pinned.yaml", docker=True, sleep=120)
    run = rig.background(*prebuild_args(path), env={"INVOKE_FDL_COMPILE_CACHE": "0", **COLD})
    victim, name = running_container(run)
    label = run_label(run)
    with unremovable(victim):
        run.process.send_signal(signal.SIGINT)
        code = run.finish(timeout=60)
        assert code == 3, run.stderr
        assert "interrupted, but not everything of this run could be stopped" in run.stderr
        assert f"prebuild: warning: container {name} could not be removed (" in run.stderr
        assert f"remove it with docker rm -f {name}" in run.stderr
        assert "operation not permitted" in run.stderr
        assert "Traceback" not in run.stderr
        assert containers(label) == [victim]  # every other container of the run is gone
    assert not (rig.project / ENVELOPE).exists()


@pytest.mark.docker
def test_watch_stopped_with_an_unremovable_container_exits_3(rig: RigCluster) -> None:
    """The same refusal during ``--watch``'s first cycle: the watch ends as a stop that
    was not clean (exit 3, the container named), never a plain 130."""
    path = cluster(rig, "watched.yaml", docker=True, sleep=120)
    run = rig.background(
        *prebuild_args(path, "--watch"), env={"INVOKE_FDL_COMPILE_CACHE": "0", **COLD}
    )
    victim, name = running_container(run)
    with unremovable(victim):
        run.process.send_signal(signal.SIGINT)
        code = run.finish(timeout=60)
        assert code == 3, run.stderr
        assert f"remove it with docker rm -f {name}" in run.stderr
        assert "Traceback" not in run.stderr


@pytest.mark.docker
def test_timed_out_build_whose_container_refuses_removal(rig: RigCluster) -> None:
    """The build's timeout expires; its container cannot be removed: the failure names it
    with the command that removes it, and exits 3, not 1."""
    settings = {**rig.docker_settings(), "env": {"FDL_FIXTURE_BUILD_SLEEP": "120"}}
    path = rig.write([rig.worker("alpha", arch=VARIANTS[0])], "timeout.yaml", docker=settings)
    run = rig.background(*prebuild_args(path, "--timeout", "20"), env=COLD)
    victim, name = running_container(run)
    with unremovable(victim):
        code = run.finish(timeout=120)
    assert code == 3, run.stderr
    paragraph = run.stderr[run.stderr.rindex("\nfdl: ") + 1 :]
    assert paragraph.startswith("fdl: 1 of 1 build(s) failed; no envelope was published."), (
        run.stderr
    )
    assert "failed: timed out after 20s" in paragraph
    assert "left running or not removed (the run is not clean, exit code 3):" in paragraph
    assert f"remove it with docker rm -f {name}" in paragraph


def test_killed_while_publishing_then_run_again_recovers(rig: RigCluster) -> None:
    """SIGKILL at the last step before publication, holding the lock, after a write that
    a kill mid-publication leaves: a partial envelope and a partial host copy (planted,
    named with the killed process's id, as the real writes name theirs). The next run
    neither waits on the dead lock nor leaves a partial file, and publishes whole."""
    path = cluster(rig, "killed.yaml")
    assert rig.inv(*prebuild_args(path)).returncode == 0
    with held_verification(rig.rig, "alpha", rig.root) as (started, go):
        run = rig.background(*prebuild_args(path), env={})
        run.wait_for(started.exists, timeout=120)
        run.process.send_signal(signal.SIGKILL)
        run.finish()
        go.touch()
    pid = run.process.pid
    envelopes = rig.project / "target/cluster/_envelopes"
    assert not (envelopes / "ddp-bench.json").exists()  # withdrawn before the builds
    (envelopes / f".ddp-bench.json.{pid}.partial").write_text('{"alpha":{"bin":"tar')
    copy = rig.project / host_binary("alpha", VARIANTS[0], "ddp-bench")
    assert copy.is_file(), "no host copy of alpha's binary"
    (copy.parent / f".ddp-bench.{pid}.partial").write_bytes(b"\x7fELF")
    done = rig.inv(*prebuild_args(path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert WAITING not in done.stderr
    assert published(rig) == ["alpha", "beta", "gamma"]
    assert sorted((rig.project / "target/cluster").rglob(".ddp-bench*.partial")) == []
