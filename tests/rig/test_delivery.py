"""Delivery verification and ``launch`` on the rig (native cargo builds).

A lagging or stale shared mount is simulated by giving a host a project path
that is a separate copy of the tree; an old glibc by the rig's ``ldd`` shim.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("fresh", "127.0.0.60"),
    HostSpec("lagging", "127.0.0.61"),
    HostSpec("nolib", "127.0.0.62"),
    HostSpec("oldglibc", "127.0.0.63", glibc_version="2.17"),
]
ARCH = "precompiled/cu126"
BIN = f"target/cluster/{{host}}/{ARCH.replace('/', '-')}/release/ddp-bench"
FAST_RETRY = {"INVOKE_FDL_VERIFY_RETRIES": "1", "INVOKE_FDL_VERIFY_RETRY_DELAY": "0.2"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("delivery"), HOSTS, [ARCH]) as cluster:
        yield cluster


def copy_view(rig: RigCluster, name: str, with_libtorch: bool = True) -> Path:
    """A host-private copy of the project: what a stale mount looks like. Without
    ``with_libtorch``, each variant's ``lib/`` is there but empty (preflight refuses a
    host without the directory, before any build; this one gets as far as verification)."""
    view = rig.root / f"view-{name}"
    shutil.rmtree(view, ignore_errors=True)
    ignore = shutil.ignore_patterns("target", *([] if with_libtorch else ["libtorch.so*"]))
    shutil.copytree(rig.project, view, ignore=ignore, symlinks=True)
    return view


def cluster(rig: RigCluster, name: str, **paths: Path) -> Path:
    workers: list[dict[str, Any]] = []
    for host in paths:
        workers.append(rig.worker(host, arch=ARCH, path=str(paths[host])))
    return rig.write(workers, name)


def prebuild(rig: RigCluster, path: Path, **env: str) -> Any:
    return rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env={**FAST_RETRY, **env}
    )


def test_stale_copy_is_caught_and_nothing_published(rig: RigCluster) -> None:
    view = copy_view(rig, "lagging")
    stale = view / BIN.format(host="lagging")
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an old binary")
    done = prebuild(rig, cluster(rig, "stale.yaml", fresh=rig.project, lagging=view))
    assert done.returncode == 1
    assert "delivery verification failed; no envelope was published" in done.stderr
    remote = hashlib.sha256(stale.read_bytes()).hexdigest()
    controller = hashlib.sha256((rig.project / BIN.format(host="lagging")).read_bytes())
    mismatch = (
        f"  lagging: {stale} differs from the controller's build (remote sha256 "
        f"{remote[:16]}…, controller {controller.hexdigest()[:16]}…): "
        "stale or lagging shared mount"
    )
    assert mismatch in done.stderr.splitlines(), f"no line {mismatch!r} in:\n{done.stderr}"
    assert "fresh:" not in done.stderr.split("verification failed")[1]
    assert not (rig.project / "target/cluster/_envelopes/ddp-bench.json").exists()


def test_missing_binary_and_missing_library_are_named(rig: RigCluster) -> None:
    view = copy_view(rig, "nolib", with_libtorch=False)
    done = prebuild(rig, cluster(rig, "nolib.yaml", nolib=view))
    assert done.returncode == 1
    assert f"nolib: {view / BIN.format(host='nolib')} does not exist" in done.stderr
    # Now the bytes arrive, but the host's libtorch is still absent.
    binary = rig.project / BIN.format(host="nolib")
    (view / BIN.format(host="nolib")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, view / BIN.format(host="nolib"))
    done = prebuild(rig, cluster(rig, "nolib.yaml", nolib=view))
    assert done.returncode == 1
    assert "nolib: libraries not found with the envelope's LD_LIBRARY_PATH: libtorch.so" in (
        done.stderr
    )


def test_lagging_mount_that_catches_up_passes_within_the_retry(rig: RigCluster) -> None:
    view = copy_view(rig, "lagging")
    target = view / BIN.format(host="lagging")
    built = rig.project / BIN.format(host="lagging")

    def catch_up() -> None:  # the "mount" delivers the bytes a moment after the build
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (rig.root / "built").exists() or built.exists():
                time.sleep(1.0)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, target)
                return
            time.sleep(0.1)

    built.unlink(missing_ok=True)
    thread = threading.Thread(target=catch_up)
    thread.start()
    done = prebuild(
        rig,
        cluster(rig, "lag.yaml", lagging=view),
        INVOKE_FDL_VERIFY_RETRIES="60",  # ends as soon as the bytes match
        INVOKE_FDL_VERIFY_RETRY_DELAY="0.5",
    )
    thread.join()
    assert done.returncode == 0, done.stderr
    assert "verify: 1 host(s) verified (same bytes, every library resolves)\n" in done.stderr


def test_glibc_shortfall_is_an_error_naming_both_versions(rig: RigCluster) -> None:
    done = prebuild(rig, cluster(rig, "glibc.yaml", oldglibc=rig.project, fresh=rig.project))
    assert done.returncode == 1
    assert "warning  oldglibc: glibc 2.17 is older" in done.stderr  # preflight only warns
    assert "oldglibc: the binary needs glibc 2.34 but the host has 2.17" in done.stderr
    path = cluster(rig, "glibc.yaml", oldglibc=rig.project)
    skipped = rig.inv("prebuild", "--cmd", "ddp-bench", "--no-verify", "--cluster-file", str(path))
    assert skipped.returncode == 0, skipped.stderr


def test_launch_runs_each_hosts_own_binary(rig: RigCluster) -> None:
    path = cluster(rig, "launch.yaml", fresh=rig.project, oldglibc=rig.project)
    assert prebuild(rig, path, INVOKE_FDL_VERIFY="0").returncode == 0
    done = rig.inv(
        "launch", "--cmd", "ddp-bench", "--cluster-file", str(path), "--", "--data-dir", "my data"
    )
    assert done.returncode == 0, done.stderr
    for host in ("fresh", "oldglibc"):
        assert f"[{host}] ddp-bench variant={ARCH} cuda=on" in done.stdout
        assert f"[{host}] args=--data-dir my data" in done.stdout
    wrong = rig.inv("launch", "--cmd", "other", "--cluster-file", str(path))
    assert wrong.returncode == 1 and "'other' has no published envelope" in wrong.stderr
    more = cluster(rig, "more.yaml", fresh=rig.project, nolib=rig.project)
    stale = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(more))
    assert stale.returncode == 1 and "nolib has no entry" in stale.stderr
    envelope = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    envelope.write_text(envelope.read_text()[:40])  # truncated on disk
    broken = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert broken.returncode == 1 and "not valid JSON" in broken.stderr
    assert "Traceback" not in broken.stderr


def test_launch_reports_every_failing_host(rig: RigCluster) -> None:
    path = cluster(rig, "fail.yaml", fresh=rig.project, nolib=rig.root / "nowhere")
    envelope = (
        '{"fresh":{"bin":"target/cluster/fresh/precompiled-cu126/release/ddp-bench",'
        f'"ld_library_path":"{rig.project}/libtorch/{ARCH}/lib","cwd_subpath":"ddp-bench"}},'
        '"nolib":{"bin":"target/cluster/nolib/x/release/ddp-bench","ld_library_path":"/x"}}'
    )
    done = rig.inv(
        "launch",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        env={"FLODL_INTERNAL_PREBUILD_PER_HOST": envelope},
    )
    assert done.returncode == 1
    assert "launch failed on nolib (exited" in done.stderr
    assert "[fresh] ddp-bench variant" in done.stdout
