"""``inv prebuild --watch`` for real: a background ``inv``, edits to the fixture crate,
the new binary run on every host over its own sshd.

Native cargo (fast to set up) for the edit loop; Docker for the stop, where
what must not be left behind is a container.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.config.layout import envelope_file
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, containers, start_rig
from rig.project import FIXTURE_DIR
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("w-blackwell", "127.0.0.110"),
    HostSpec("w-pascal", "127.0.0.111"),
    HostSpec("w-cpu", "127.0.0.112"),
]
ARCHS = {
    "w-blackwell": "precompiled/cu128",
    "w-pascal": "builds/sm61-sm120",
    "w-cpu": "precompiled/cpu",
}
ENVELOPE = envelope_file("ddp-bench")
#: No compile cache: three builds at once, no sccache server left between tests.
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
#: Seconds an edit may take to reach every host (a one-line edit takes a few).
EDIT_BUDGET = 60
FIXTURE_MAIN = FIXTURE_DIR / "ddp-bench/src/main.rs"
CYCLE = re.compile(r"^watch: cycle (\d+) (ok|FAILED)")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted(set(ARCHS.values()))
    with start_rig(tmp_path_factory.mktemp("watch"), HOSTS, variants, docker=True) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def pristine_source(rig: RigCluster) -> None:
    """Each test starts from the fixture's own main.rs (rev 0); the ``inv`` runs a test
    left are stopped by ``tests/rig/conftest.py``. Other watch modules import it."""
    set_rev(rig, "0")


def main_rs(rig: RigCluster) -> Path:
    return rig.project / "ddp-bench/src/main.rs"


def set_rev(rig: RigCluster, rev: str) -> None:
    """The fixture's main.rs, printing ``rev=<rev>`` at the end of its first line."""
    text = FIXTURE_MAIN.read_text().replace('cuda={cuda}");', f'cuda={{cuda}} rev={rev}");')
    assert f"rev={rev}" in text
    main_rs(rig).write_text(text)


def cluster_file(rig: RigCluster, name: str, docker: dict[str, Any] | None = None) -> Path:
    workers = [rig.worker(host, arch=arch) for host, arch in ARCHS.items()]
    return rig.write(workers, name, **({"docker": docker} if docker else {}))


def watch(rig: RigCluster, path: Path, env: dict[str, str] | None = None) -> Running:
    return rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--watch",
        "--json",
        "--cluster-file",
        str(path),
        env={**ENV, **(env or {})},
    )


def cycles(run: Running) -> list[tuple[int, str, float]]:
    """(number, ok or FAILED, seconds after the start) of every cycle so far."""
    found = []
    for at, line in list(run.lines):
        match = CYCLE.match(line)
        if match:
            found.append((int(match.group(1)), match.group(2), at))
    return found


def wait_cycle(run: Running, number: int, timeout: float = EDIT_BUDGET) -> tuple[str, float]:
    run.wait_for(lambda: any(n == number for n, _, _ in cycles(run)), timeout)
    return next((state, at) for n, state, at in cycles(run) if n == number)


def revs_on_hosts(rig: RigCluster) -> dict[str, str]:
    """What each host's published binary prints, run over its own sshd."""
    envelopes = decode((rig.project / ENVELOPE).read_text(), "envelope")
    assert sorted(envelopes) == sorted(ARCHS)
    return {
        host: rig.run_on_host(host, str(rig.project), entry).rsplit("rev=", 1)[-1]
        for host, entry in envelopes.items()
    }


def test_an_edit_reaches_every_host(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "edit.yaml"))
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    assert revs_on_hosts(rig) == dict.fromkeys(ARCHS, "0")
    saved = time.monotonic()
    set_rev(rig, "1")
    state, _ = wait_cycle(run, 2)
    latency = time.monotonic() - saved
    assert state == "ok", run.stderr
    assert latency < EDIT_BUDGET
    assert revs_on_hosts(rig) == dict.fromkeys(ARCHS, "1")
    line = next(text for _, text in run.lines if text.startswith("watch: cycle 2 ok"))
    assert "(ddp-bench/src/main.rs changed)" in line
    assert "rebuilt precompiled/cu128, builds/sm61-sm120, precompiled/cpu;" in line
    assert "3 host(s) verified" in line
    # --json: one line per cycle, each exactly the envelope published then
    assert run.stdout.splitlines()[-1] + "\n" == (rig.project / ENVELOPE).read_text()
    assert len(run.stdout.splitlines()) == 2
    # Nothing under target/ (the builds' own writes) ever started a cycle.
    time.sleep(3)
    assert len(cycles(run)) == 2, run.stderr


def test_a_burst_of_saves_is_one_or_two_cycles(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "burst.yaml"))
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    for i in range(10):  # an editor saving ten times in one second
        set_rev(rig, f"burst{i}")
        time.sleep(0.1)
    run.wait_for(lambda: revs_published(rig, run, "burst9"), EDIT_BUDGET)
    time.sleep(3)  # nothing more may follow
    after_first = [c for c in cycles(run) if c[0] > 1]
    assert 1 <= len(after_first) <= 2, run.stderr
    assert all(state == "ok" for _, state, _ in after_first)
    assert revs_on_hosts(rig) == dict.fromkeys(ARCHS, "burst9")


def revs_published(rig: RigCluster, run: Running, rev: str) -> bool:
    """The last cycle succeeded after main.rs said ``rev``, and its envelope is there."""
    done = cycles(run)
    return bool(done) and done[-1][1] == "ok" and not run_pending(rig) and _has(rig, rev)


def run_pending(rig: RigCluster) -> bool:
    state = rig.project / "target/cluster/_watch/ddp-bench.json"
    try:
        data = json.loads(state.read_text())
    except (OSError, ValueError):
        return True
    return bool(data["state"] != "idle" or data["queued"])


def _has(rig: RigCluster, rev: str) -> bool:
    try:
        return set(revs_on_hosts(rig).values()) == {rev}
    except (OSError, AssertionError):
        return False


def test_an_edit_in_a_path_dependency_rebuilds(rig: RigCluster) -> None:
    """The crate's path dependency lives elsewhere in the workspace: it is watched too."""
    library = rig.project / "fixture-util/src/lib.rs"
    if not library.is_file():
        pytest.skip("this fixture has no path dependency")
    original = library.read_text()
    run = watch(rig, cluster_file(rig, "pathdep.yaml"))
    try:
        assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
        library.write_text(original.replace('println!("args={}"', 'println!("argv={}"', 1))
        assert wait_cycle(run, 2)[0] == "ok", run.stderr
        line = next(text for _, text in run.lines if text.startswith("watch: cycle 2 ok"))
        assert "(fixture-util/src/lib.rs changed): rebuilt precompiled/cu128" in line
        envelopes = decode((rig.project / ENVELOPE).read_text(), "envelope")
        entry = envelopes["w-cpu"]
        command = (
            f"cd {rig.project}/{entry.cwd_subpath} && LD_LIBRARY_PATH={entry.ld_library_path} "
            f"{rig.project}/{entry.bin}"
        )
        done = subprocess.run(
            rig.rig.ssh_argv("w-cpu", command), capture_output=True, text=True, timeout=30
        )
        assert done.stdout.splitlines()[1] == "argv=", done.stdout + done.stderr
    finally:
        library.write_text(original)


def test_a_syntax_error_fails_a_cycle_and_the_fix_publishes(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "syntax.yaml"))
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    main_rs(rig).write_text(main_rs(rig).read_text().replace("fn main() {", "fn main() {{", 1))
    assert wait_cycle(run, 2)[0] == "FAILED", run.stderr
    assert "this file contains an unclosed delimiter" in run.stderr  # rustc's own words
    assert "3 of 3 build(s) failed" in run.stderr or "build(s) failed" in run.stderr
    assert not (rig.project / ENVELOPE).exists()
    assert run.process.poll() is None  # still watching
    set_rev(rig, "fixed")
    assert wait_cycle(run, 3)[0] == "ok", run.stderr
    assert revs_on_hosts(rig) == dict.fromkeys(ARCHS, "fixed")
    assert len(run.stdout.splitlines()) == 2  # no line for the failed cycle
    assert "Traceback" not in run.stderr


def test_a_launch_during_a_cycle_runs_the_new_binary(rig: RigCluster) -> None:
    path = cluster_file(rig, "launch.yaml")
    # Each build script run sleeps 3 s: a cycle that reruns it stays in flight a while.
    run = watch(rig, path, {"FDL_FIXTURE_BUILD_SLEEP": "3"})
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    build_rs = rig.project / "ddp-bench/build.rs"
    original = build_rs.read_text()
    try:
        set_rev(rig, "launched")
        build_rs.write_text(original + "// touched\n")  # reruns the (slow) build script
        launch = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path), env=ENV)
    finally:
        build_rs.write_text(original)
    assert launch.returncode == 0, launch.stderr
    assert "launch: waiting for the prebuild watcher" in launch.stderr
    for host in ARCHS:
        assert re.search(rf"^\[{host}\] ddp-bench .* rev=launched$", launch.stdout, re.M), (
            launch.stdout
        )


def test_launch_without_a_live_watcher_does_not_wait(rig: RigCluster) -> None:
    path = cluster_file(rig, "nowatch.yaml")
    run = watch(rig, path)
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    state = rig.project / "target/cluster/_watch/ddp-bench.json"
    text = state.read_text()
    run.process.kill()  # no clean-up: its state stays behind, its lock does not
    run.finish()
    state.write_text(text.replace('"idle"', '"building"'))
    started = time.monotonic()
    launch = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path), env=ENV)
    assert launch.returncode == 0, launch.stderr
    assert time.monotonic() - started < 30
    assert "ignoring the state of a prebuild watcher that has ended" in launch.stderr


def test_a_cluster_file_change_rereads_it_and_probes_again(rig: RigCluster) -> None:
    path = cluster_file(rig, "reread.yaml")
    run = watch(rig, path)
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    workers = [rig.worker(h, arch=a) for h, a in ARCHS.items() if h != "w-cpu"]
    rig.write(workers, "reread.yaml")
    assert wait_cycle(run, 2)[0] == "ok", run.stderr
    line = next(text for _, text in run.lines if text.startswith("watch: cycle 2 ok"))
    assert "reread.yaml changed): preflight ok;" in line  # probed again
    envelopes = decode((rig.project / ENVELOPE).read_text(), "envelope")
    assert sorted(envelopes) == ["w-blackwell", "w-pascal"]


def test_a_new_libtorch_in_a_variant_rebuilds_against_it(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "libtorch.yaml"))
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    library = rig.project / "libtorch/precompiled/cpu/lib/libtorch.so"
    library.write_bytes(library.read_bytes())  # the variant replaced in place
    assert wait_cycle(run, 2)[0] == "ok", run.stderr
    line = next(text for _, text in run.lines if text.startswith("watch: cycle 2 ok"))
    assert "(libtorch/precompiled/cpu/lib/libtorch.so changed): rebuilt precompiled/cpu" in line
    assert "(2 up to date)" in line


def test_forced_polling_sees_an_edit(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "poll.yaml"), {"INVOKE_FDL_WATCH_POLLING": "1"})
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    assert "(polling every 0.5s (fdl.watch_polling))" in run.stderr
    set_rev(rig, "polled")
    assert wait_cycle(run, 2)[0] == "ok", run.stderr
    assert revs_on_hosts(rig) == dict.fromkeys(ARCHS, "polled")


def test_sigterm_when_idle_keeps_the_last_good_envelope(rig: RigCluster) -> None:
    run = watch(rig, cluster_file(rig, "idle.yaml"))
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    published = (rig.project / ENVELOPE).read_text()
    run.process.send_signal(signal.SIGTERM)
    assert run.finish(30) == 130
    assert "watch stopped; the envelope of ddp-bench stays published (cycle 1's)" in run.stderr
    assert (rig.project / ENVELOPE).read_text() == published
    assert not (rig.project / "target/cluster/_watch/ddp-bench.json").exists()


def test_sigterm_during_a_docker_cycle_leaves_no_container_and_no_envelope(rig: RigCluster) -> None:
    docker = {**rig.docker_settings(), "env": {"FDL_FIXTURE_BUILD_SLEEP": "120"}}
    cold = {"INVOKE_FDL_WARM_CONTAINERS": "0"}  # a container per build (warm: test_warm.py)
    run = watch(rig, cluster_file(rig, "docker.yaml", docker), cold)
    run.wait_for(lambda: re.search(r"\(run ([0-9a-f]+):", run.stderr) is not None, 120)
    match = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    assert match is not None
    label = f"fdl-tasks.run={match.group(1)}"
    run.wait_for(lambda: len(containers(label, running=True)) >= 1, 60)
    run.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = run.finish(60)
    assert time.monotonic() - signalled < 20
    assert code == 130, run.stderr
    assert containers(label) == []
    assert "watch stopped during cycle 1; no envelope of ddp-bench is published" in run.stderr
    envelopes = rig.project / ENVELOPE
    assert not envelopes.exists()
    assert list(envelopes.parent.glob(".*partial")) == []
    assert not (rig.project / "target/cluster/_watch/ddp-bench.json").exists()
    assert "Traceback" not in run.stderr
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
