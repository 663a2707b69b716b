"""Copy delivery on the rig, through the real ``inv`` (native cargo builds, real sshd, SFTP).

The rig is :mod:`tests.rig.copy_rig`'s. The tests run in order, each starting from
the state the one before left (a first prebuild, a second one, an edit, ...).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from rig.harness import RigCluster, Running
from rig.sshrig import RIG_USER
from tests.rig.copy_rig import (
    ARCHS,
    COPY_HOSTS,
    PAD_BYTES,
    binary,
    copy_rig,
    edit,
    hosts,
    launch,
    on_host,
    prebuild,
    private_dir,
    sent,
    sha,
    write_cluster,
)

pytestmark = pytest.mark.rig


@pytest.fixture(scope="module")
def rig() -> Iterator[RigCluster]:
    with copy_rig(hosts("127.0.0.230", "127.0.0.231", "127.0.0.232")) as cluster:
        yield cluster


def test_private_path_host_runs_its_own_variant(rig: RigCluster) -> None:
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert sent(done.stderr)[:1] == (2,)
    for host in COPY_HOSTS:
        copy = private_dir(rig, host) / binary(host)
        assert sha(copy) == sha(rig.project / binary(host))
        assert os.access(copy, os.X_OK)
        assert (private_dir(rig, host) / "ddp-bench").is_dir()  # the command's cwd_subpath
        assert not list(copy.parent.glob(".*fdl-part*"))
    assert "2 host(s) verified" not in done.stderr and "3 host(s) verified" in done.stderr
    ran = launch(rig)
    assert ran.returncode == 0, ran.stderr
    for host, arch in ARCHS.items():
        assert f"[{host}] ddp-bench variant={arch}" in ran.stdout


def test_second_prebuild_sends_nothing(rig: RigCluster) -> None:
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert sent(done.stderr) == (0, 0, 2)
    assert "copy: cp-a: sent" not in done.stderr


def test_edit_sends_once_and_a_running_binary_keeps_running(rig: RigCluster) -> None:
    """The old binary runs on cp-a during the upload; launch then runs the new one."""
    view = private_dir(rig, "cp-a")
    lib = view / "libtorch" / ARCHS["cp-a"] / "lib"
    old = on_host(rig, "cp-a", f"LD_LIBRARY_PATH={lib} {view / binary('cp-a')} --heartbeat 60")
    assert old.stdout is not None and "variant=" in old.stdout.readline()
    edit(rig, 2)
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    hosts, size, current = sent(done.stderr)
    assert (hosts, current) == (2, 0) and size > 2 * PAD_BYTES
    for host in COPY_HOSTS:
        assert done.stderr.count(f"copy: {host}: sent") == 1
        assert sha(private_dir(rig, host) / binary(host)) == sha(rig.project / binary(host))
    assert old.poll() is None, "the running binary was disturbed by the upload"
    assert old.stdout.readline().startswith(("args=", "step"))
    ran = launch(rig)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("edition=2") == 3, ran.stdout
    old.wait(timeout=20)  # launch stopped the stale one before its spawn


def test_missing_variant_on_a_copy_host_stops_before_any_build(rig: RigCluster) -> None:
    bare = rig.root / "bare-cp-b"
    bare.mkdir(exist_ok=True)
    shutil.chown(bare, RIG_USER, RIG_USER)
    name = "bare.yaml"
    write_cluster(rig, name, **{"cp-b": {"path": str(bare)}})
    done = prebuild(rig, name=name)
    assert done.returncode == 1, done.stderr
    lib = bare / "libtorch" / ARCHS["cp-b"] / "lib"
    assert f"cp-b: libtorch variant not found at {lib}" in done.stderr, done.stderr
    assert "nothing was built" in done.stderr
    assert " started" not in done.stderr and not (bare / "target").exists()


def push(rig: RigCluster, name: str) -> Any:
    return rig.inv("push-libtorch", "--host", "cp-b", "--cluster-file", str(rig.root / name))


def test_push_libtorch_moves_only_changed_files(rig: RigCluster) -> None:
    """After the test above: cp-b's bare path gets its variant, then nothing, then one file."""
    bare = rig.root / "bare-cp-b"
    variant = rig.project / "libtorch" / ARCHS["cp-b"]
    done = push(rig, "bare.yaml")
    assert done.returncode == 0, done.stderr
    files = sorted(p.relative_to(variant) for p in variant.rglob("*") if p.is_file())
    assert files and f"cp-b: {len(files)} of {len(files)} file(s) to send" in done.stderr
    for relative in files:
        copy = bare / "libtorch" / ARCHS["cp-b"] / relative
        assert copy.read_bytes() == (variant / relative).read_bytes()
    again = push(rig, "bare.yaml")
    assert f"cp-b: 0 of {len(files)} file(s) to send" in again.stderr, again.stderr
    extra = variant / "share" / "note.txt"
    extra.parent.mkdir(exist_ok=True)
    extra.write_text("one more file\n")
    try:
        third = push(rig, "bare.yaml")
        assert f"cp-b: 1 of {len(files) + 1} file(s) to send" in third.stderr, third.stderr
    finally:
        extra.unlink()
    built = prebuild(rig, name="bare.yaml")
    assert built.returncode == 0, built.stderr


CYCLE = re.compile(r"^watch: cycle (\d+) (ok|FAILED)")


def cycle_states(run: Running) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for _, line in list(run.lines) if (m := CYCLE.match(line))}


def test_watch_sends_each_edit_to_the_copy_hosts(rig: RigCluster) -> None:
    run = rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--watch",
        "--cluster-file",
        str(rig.root / "cluster.yaml"),
    )
    run.wait_for(lambda: 1 in cycle_states(run), 180)
    assert cycle_states(run)[1] == "ok", run.stderr
    edit(rig, 6)
    run.wait_for(lambda: 2 in cycle_states(run), 180)
    assert cycle_states(run)[2] == "ok", run.stderr
    for host in COPY_HOSTS:
        final = private_dir(rig, host) / binary(host)
        assert sha(final) == sha(rig.project / binary(host))
    view = private_dir(rig, "cp-a")
    lib = view / "libtorch" / ARCHS["cp-a"] / "lib"
    shown = on_host(rig, "cp-a", f"LD_LIBRARY_PATH={lib} {view / binary('cp-a')}")
    out, _ = shown.communicate(timeout=30)
    assert "edition=6" in out
    assert run.stop() in (0, 130, -signal.SIGINT), run.stderr


def test_build_host_copies_to_its_copy_host(rig: RigCluster) -> None:
    edit(rig, 8)
    done = rig.inv(
        "build-host", "--host", "cp-a", "-c", "ddp-bench", "-f", str(rig.root / "cluster.yaml")
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("copy: cp-a: sent") == 1 and "copy: cp-b" not in done.stderr
    final = private_dir(rig, "cp-a") / binary("cp-a")
    assert sha(final) == sha(rig.project / binary("cp-a"))
