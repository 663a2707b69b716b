"""The fault matrix of docs/guarantees.md, each row a real ``inv prebuild`` on the rig.

Real sshd hosts and native cargo; the faults are real too (root is needed for the
mounts, which the rig runs as): a small tmpfs that fills, a read-only bind mount, a
host's own bind-mounted view of the project unmounted, a session's sshd killed.
Where a fault must land at one moment, a ``sha256sum`` shim on the host holds its
verification until the test has planted it (:func:`rig.faults.held_verification`).
Each test checks what the user is promised: the exit code, one paragraph naming the
fault, the last good envelope kept or withdrawn, no partial file at a final path.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.publish.envelope import decode
from rig.faults import bind_view, fill, held_verification, kill_sshd, read_only, tmpfs, unmount
from rig.harness import RigCluster, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [
    pytest.mark.rig,
    pytest.mark.skipif(os.geteuid() != 0, reason="the faults are mounts: they need root"),
]

HOSTS = [
    HostSpec("alpha", "127.0.0.208"),
    HostSpec("beta", "127.0.0.209"),
    HostSpec("gamma", "127.0.0.210"),
]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"
SLOW = {"FDL_FIXTURE_BUILD_SLEEP": "6"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("matrix"), HOSTS, VARIANTS) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def fresh_targets(rig: RigCluster) -> None:
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    for host in HOSTS:
        rig.rig.start_host(host.name)


def cluster(rig: RigCluster, name: str, **paths: str) -> Path:
    """Every host on the project; ``paths`` gives a host its own view of it."""
    archs = dict(zip([h.name for h in HOSTS], VARIANTS, strict=True))
    fields: dict[str, dict[str, Any]] = {h: {"path": paths[h]} if h in paths else {} for h in archs}
    return rig.write([rig.worker(h, arch=a, **fields[h]) for h, a in archs.items()], name)


def published(rig: RigCluster) -> list[str]:
    return sorted(decode((rig.project / ENVELOPE).read_text(), ENVELOPE))


def partials(directory: Path) -> list[Path]:
    return sorted(directory.rglob(".*.partial"))


def one_paragraph(stderr: str) -> str:
    """The error paragraph ``inv`` ends with (``fdl: …`` to the end), and no traceback."""
    assert "Traceback" not in stderr, stderr
    assert "\nfdl: " in stderr, stderr
    return stderr[stderr.rindex("\nfdl: ") + 1 :]


def test_disk_full_during_a_build(rig: RigCluster) -> None:
    """The tmpfs holding target/cluster fills while cargo runs: the build fails naming the
    full disk, exit 1; the command's envelope is withdrawn (its binaries are being replaced)."""
    path = cluster(rig, "full-build.yaml")
    with tmpfs(rig.project / "target/cluster", "256M") as cluster_dir:
        assert rig.inv(*prebuild_args(path)).returncode == 0
        run = rig.background(*prebuild_args(path), env=SLOW)  # build.rs runs again, sleeping
        run.wait_for(lambda: "build(s) with" in run.stderr)
        fill(cluster_dir)
        assert run.finish() == 1, run.stderr
        paragraph = one_paragraph(run.stderr)
        assert "build(s) failed; no envelope was published." in paragraph
        assert f"the disk holding {cluster_dir}/" in paragraph
        # cargo's own words were said as it ran, once, not repeated in the summary
        assert "No space left on device" in run.stderr
        assert not (rig.project / ENVELOPE).exists()
        assert partials(cluster_dir) == []


def test_disk_full_during_publication(rig: RigCluster) -> None:
    """The envelope's file system fills after the builds, before the write: exit 1, the
    write named with ENOSPC, no envelope, and no partial file left beside it."""
    path = cluster(rig, "full-publish.yaml")
    with tmpfs(rig.project / "target/cluster/_envelopes", "1M") as envelopes:
        assert rig.inv(*prebuild_args(path)).returncode == 0
        assert published(rig) == ["alpha", "beta", "gamma"]
        with held_verification(rig.rig, "alpha", rig.root) as (started, go):
            run = rig.background(*prebuild_args(path), env={})
            run.wait_for(started.exists, timeout=120)
            fill(envelopes)
            go.touch()
            assert run.finish() == 1, run.stderr
        paragraph = one_paragraph(run.stderr)
        assert paragraph.startswith(f"fdl: cannot write {rig.project / ENVELOPE}: ")
        assert "No space left on device" in paragraph
        assert not (rig.project / ENVELOPE).exists()
        assert partials(envelopes) == []


def test_target_tree_read_only(rig: RigCluster) -> None:
    """Nothing can be built or withdrawn: exit 1 naming the tree; the last good envelope
    stays published, and it is still right (nothing was rebuilt)."""
    path = cluster(rig, "read-only.yaml")
    assert rig.inv(*prebuild_args(path)).returncode == 0
    before = (rig.project / ENVELOPE).read_text()
    with read_only(rig.project / "target/cluster"):
        done = rig.inv(*prebuild_args(path))
    assert done.returncode == 1, done.stderr
    paragraph = one_paragraph(done.stderr)
    assert paragraph.startswith("fdl: the target tree is not writable: cannot create ")
    assert "Read-only file system" in paragraph
    assert "build(s) with" not in done.stderr
    assert (rig.project / ENVELOPE).read_text() == before


def test_host_view_of_the_mount_disappears(rig: RigCluster) -> None:
    """beta sees the project through its own mount, gone after the build: verification
    fails naming beta and its path, exit 1, nothing published (beta could not run it)."""
    view = rig.root / "views" / "beta"
    with bind_view(rig.project, view):
        path = cluster(rig, "view.yaml", beta=str(view))
        with held_verification(rig.rig, "beta", rig.root) as (started, go):
            run = rig.background(*prebuild_args(path), env={})
            run.wait_for(started.exists, timeout=120)  # built; beta is verifying
            unmount(view)
            go.touch()
            assert run.finish() == 1, run.stderr
    paragraph = one_paragraph(run.stderr)
    assert paragraph.startswith("fdl: delivery verification failed; no envelope was published.")
    assert f"beta: {view}/target/cluster/beta/" in paragraph
    assert "does not exist in this host's view of the mount" in paragraph
    assert not (rig.project / ENVELOPE).exists()


@pytest.mark.parametrize("required", [False, True], ids=["default", "require-verified"])
def test_ssh_dropped_during_verification(rig: RigCluster, required: bool) -> None:
    """beta's sshd dies while beta verifies: beta is named not verified. By default that is
    a warning (exit 0, the envelope published); with --require-verified exit 1, nothing."""
    path = cluster(rig, "drop.yaml")
    options = ["--require-verified"] if required else []
    with held_verification(rig.rig, "beta", rig.root) as (started, _):
        run = rig.background(*prebuild_args(path, *options), env={})
        run.wait_for(started.exists, timeout=120)
        kill_sshd(rig.rig.host_dir("beta") / "sshd_config")
        code = run.finish()
    assert "verify: beta not verified: " in run.stderr, run.stderr
    if required:
        assert code == 1, run.stderr
        paragraph = one_paragraph(run.stderr)
        assert "1 host(s) not verified and fdl.require_verified is on" in paragraph
        assert not (rig.project / ENVELOPE).exists()
    else:
        assert code == 0, run.stderr
        summary = "2 host(s) verified (same bytes, every library resolves), 1 not verified: beta ("
        assert summary in run.stderr
        assert published(rig) == ["alpha", "beta", "gamma"]
    rig.rig.stop_host("beta")  # reaps the orphaned session processes too
