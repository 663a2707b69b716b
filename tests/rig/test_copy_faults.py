"""Copy delivery under faults, on the rig, through the real ``inv``: a killed ``inv``, a
dropped connection, Ctrl-C, a full disk (a real tmpfs) and an unwritable path.

The rig is :mod:`tests.rig.copy_rig`'s; a first prebuild puts a binary on each
copy host, so every fault below meets an older copy in place.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.harness import RigCluster
from rig.sshrig import RIG_USER
from tests.rig.copy_rig import (
    ARCHS,
    COPY_HOSTS,
    binary,
    copy_rig,
    edit,
    freeze_mid_upload,
    hosts,
    interrupt_mid_upload,
    launch,
    parts,
    prebuild,
    private_dir,
    sftp_sessions,
    sha,
    write_cluster,
)

pytestmark = pytest.mark.rig


@pytest.fixture(scope="module")
def rig() -> Iterator[RigCluster]:
    with copy_rig(hosts("127.0.0.233", "127.0.0.234", "127.0.0.235")) as cluster:
        done = prebuild(cluster)
        assert done.returncode == 0, done.stderr
        yield cluster


def test_killed_upload_leaves_no_partial_file(rig: RigCluster) -> None:
    before = {h: sha(private_dir(rig, h) / binary(h)) for h in COPY_HOSTS}
    edit(rig, 3)
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, "cp-a", set())
    run.process.kill()
    run.process.wait()
    for host in COPY_HOSTS:
        final = private_dir(rig, host) / binary(host)
        assert sha(final) in (before[host], sha(rig.project / binary(host)))
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert not parts(rig, "cp-a") and not parts(rig, "cp-b"), done.stderr
    ran = launch(rig)
    assert ran.stdout.count("edition=3") == 3, ran.stdout


def test_dropped_connection_is_retried_once(rig: RigCluster) -> None:
    """cp-b's ssh session is killed mid-upload: the upload starts again on a new connection."""
    edit(rig, 4)
    left = set(parts(rig, "cp-b"))  # none unless an earlier failed run left one
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, "cp-b", left)
    sessions = sftp_sessions(rig, "cp-b")
    assert sessions, "no SFTP session to cp-b"
    for session in sessions:
        session.send_signal(signal.SIGKILL)
    run.process.send_signal(signal.SIGCONT)
    assert run.finish(timeout=240) == 0, run.stderr
    assert "copy: cp-b: connection dropped mid-upload" in run.stderr
    assert run.stderr.count("copy: cp-b: sent") == 1
    final = private_dir(rig, "cp-b") / binary("cp-b")
    assert sha(final) == sha(rig.project / binary("cp-b"))
    assert not parts(rig, "cp-b")


@pytest.fixture
def small_disk(rig: RigCluster) -> Iterator[Path]:
    """cp-b's path on an 8 MB tmpfs holding its libtorch variant: the binary needs 40."""
    view = private_dir(rig, "cp-b").with_name("small-cp-b")
    view.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(view)], check=True)
    try:
        variant = Path("libtorch") / ARCHS["cp-b"]
        shutil.copytree(private_dir(rig, "cp-b") / variant, view / variant, symlinks=True)
        subprocess.run(["chown", "-R", f"{RIG_USER}:{RIG_USER}", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_full_disk_and_unwritable_path_name_the_host_others_finish(
    rig: RigCluster, small_disk: Path
) -> None:
    locked = rig.root / "locked-cp-b"
    variant = Path("libtorch") / ARCHS["cp-b"]
    shutil.rmtree(locked, ignore_errors=True)  # root's: the ssh user reads it, cannot write
    shutil.copytree(private_dir(rig, "cp-b") / variant, locked / variant, symlinks=True)
    edit(rig, 5)
    for path, expected in [
        (small_disk, f"cp-b: not enough space in {small_disk / binary('cp-b')}".rsplit("/", 1)[0]),
        (locked, f"cp-b: {locked / binary('cp-b')}".rsplit("/", 1)[0] + " cannot be created"),
    ]:
        name = f"fault-{path.name}.yaml"
        write_cluster(rig, name, **{"cp-b": {"path": str(path)}})
        done = prebuild(rig, name=name)
        assert done.returncode == 1, done.stderr
        assert "copy to 1 host(s) failed; no envelope was published" in done.stderr
        assert expected in done.stderr, done.stderr
        if path == small_disk:
            assert re.search(r"needs \d+ bytes \([\d.]+ MB\), [\d.]+ MB free", done.stderr)
            assert "copy: sending to 1 host(s)" in done.stderr  # cp-b refused before sending
        assert "Traceback" not in done.stderr
        final = private_dir(rig, "cp-a") / binary("cp-a")
        assert sha(final) == sha(rig.project / binary("cp-a")), "cp-a did not finish"
    assert not list(small_disk.rglob("*fdl-part*"))


def test_ctrl_c_mid_upload_removes_the_temporary_file(rig: RigCluster) -> None:
    run = interrupt_mid_upload(rig, "cp-a", 7)
    assert not parts(rig, "cp-b"), run.stderr
