"""``inv build-host`` / ``inv prebuild`` for real: docker and native cargo, on the rig.

Each libtorch variant is a stub shared library compiled from C (rig/project.py);
the fixture binary links it, prints the variant it loaded and whether it was
built with the ``cuda`` feature, and cannot start without the right
``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from fdl_tasks.build.backends.docker_run import docker_line
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.loader import load_cluster
from fdl_tasks.config.model import DockerSettings
from fdl_tasks.publish.envelope import decode
from rig.harness import OWNER_LABEL, RigCluster, containers, start_rig
from rig.project import add_variant, break_variant
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

VARIANTS = (
    "precompiled/cu128",
    "precompiled/cu126",
    "builds/sm61-sm120",
    "precompiled/cpu",
    "precompiled/cu118",
)
HOSTS = [
    HostSpec("blackwell", "127.0.0.50"),
    HostSpec("ada", "127.0.0.51"),
    HostSpec("pascal", "127.0.0.52"),
    HostSpec("cpu-node", "127.0.0.53"),
    HostSpec("twin", "127.0.0.54"),
]
ARCHS = {
    "blackwell": "precompiled/cu128",
    "ada": "precompiled/cu126",
    "pascal": "builds/sm61-sm120",
    "cpu-node": "precompiled/cpu",
    "twin": "precompiled/cu128",
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("builds"), HOSTS, VARIANTS, docker=True) as cluster:
        view = cluster.root / "mnt-pascal"  # pascal sees the share at another path
        view.symlink_to(cluster.project)
        yield cluster


def workers(rig: RigCluster, archs: dict[str, str] | None = None) -> list[dict[str, Any]]:
    archs = archs or ARCHS
    entries = [
        {
            "host": "ctrl",
            "path": str(rig.project),
            "arch": "precompiled/cu128",
            "data_path": str(rig.project),
        }
    ]
    for name, arch in archs.items():
        entry = rig.worker(name, arch=arch)
        if name == "pascal":
            entry["path"] = str(rig.root / "mnt-pascal")
        entries.append(entry)
    return entries


def assert_runs_everywhere(rig: RigCluster, stdout: str, archs: dict[str, str]) -> None:
    envelope_file = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    assert envelope_file.read_text() == stdout  # --json prints exactly the published text
    envelopes = decode(stdout, "stdout")
    assert sorted(envelopes) == sorted(archs)  # never the controller
    for host, arch in archs.items():
        entry = envelopes[host]
        path = str(rig.root / "mnt-pascal") if host == "pascal" else str(rig.project)
        assert entry.ld_library_path == f"{path}/libtorch/{arch}/lib"
        assert entry.cwd_subpath == "ddp-bench"
        cuda = "off" if arch.endswith("cpu") else "on"
        assert rig.run_on_host(host, path, entry) == f"ddp-bench variant={arch} cuda={cuda}"
    assert not (rig.project / "target/cluster/ctrl").exists()


def test_prebuild_in_docker(rig: RigCluster) -> None:
    path = rig.write(workers(rig), "docker.yaml", docker=rig.docker_settings())
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--json", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert_runs_everywhere(rig, done.stdout.strip() + "\n", ARCHS)
    # blackwell and twin share one build: 4 distinct builds for 5 hosts.
    assert done.stderr.count("Compiling ddp-bench") == 4
    assert "blackwell  precompiled/cu128  shared by 2" in done.stderr
    # The controller's own user owns what the container wrote (root here).
    binary = rig.project / "target/cluster/blackwell/precompiled-cu128/release/ddp-bench"
    assert binary.stat().st_uid == 0
    # --rm: no container of this rig left behind (other rigs may be building meanwhile)
    assert containers("fdl-tasks.run", f"{OWNER_LABEL}={rig.owner}") == []


def test_prebuild_native_one_build_per_host(rig: RigCluster) -> None:
    path = rig.write(workers(rig), "native.yaml")
    done = rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--json", "--per-host", "--cluster-file", str(path)
    )
    assert done.returncode == 0, done.stderr
    assert_runs_everywhere(rig, done.stdout.strip() + "\n", ARCHS)
    for host, arch in ARCHS.items():  # one target dir, one log per host
        assert (
            rig.project / "target/cluster" / host / arch.replace("/", "-") / "build-ddp-bench.log"
        ).is_file()


def test_arch_change_builds_fresh_in_a_new_dir(rig: RigCluster) -> None:
    archs = {"blackwell": "precompiled/cu128"}
    path = rig.write(workers(rig, archs), "swap.yaml")
    assert (
        rig.inv(
            "prebuild", "--cmd", "ddp-bench", "--per-host", "--cluster-file", str(path)
        ).returncode
        == 0
    )
    old = rig.project / "target/cluster/blackwell/precompiled-cu128/release/ddp-bench"
    old_bytes = old.read_bytes()
    swapped = {"blackwell": "precompiled/cu126"}
    path = rig.write(workers(rig, swapped), "swap.yaml")
    done = rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--per-host", "--json", "--cluster-file", str(path)
    )
    assert done.returncode == 0, done.stderr
    assert "Compiling ddp-bench" in done.stderr  # a fresh build, not a cache hit
    assert_runs_everywhere(rig, done.stdout.strip() + "\n", swapped)
    assert old.read_bytes() == old_bytes  # the old variant's dir is left alone


def test_a_missing_variant_is_refused_before_any_build(rig: RigCluster) -> None:
    """A typo in 'arch' (no libtorch/<arch>/lib on the controller) is a preflight error
    of the controller, naming the host and the path looked for; nothing is built."""
    broken_lib = rig.project / "libtorch/precompiled/cu118"
    break_variant(rig.project, "precompiled/cu118")
    archs = {"blackwell": "precompiled/cu128", "ada": "precompiled/cu118"}
    path = rig.write(workers(rig, archs), "typo.yaml")
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 1
    assert (
        "  error    ctrl (controller, local): libtorch variant(s) not found on the controller "
        f"(a typo in 'arch'?): ada (arch precompiled/cu118): {broken_lib}/lib\n"
    ) in done.stderr
    # The host sees the same project: the variant is missing in its view too.
    assert f"  error    ada: libtorch variant not found at {broken_lib}/lib in this" in done.stderr
    assert done.stderr.endswith("fdl: preflight found errors on ctrl, ada; nothing was built\n")
    assert not (rig.project / "target").exists()


def test_broken_hosts_fail_together_and_others_finish(rig: RigCluster) -> None:
    bad_build = rig.project / "libtorch/builds/bad/lib"
    bad_build.mkdir(parents=True, exist_ok=True)  # lib/ without libtorch.so: cargo fails
    (rig.project / "libtorch/builds/worse/lib").mkdir(parents=True, exist_ok=True)
    archs = {
        "blackwell": "precompiled/cu128",
        "ada": "builds/worse",
        "pascal": "builds/bad",
        "cpu-node": "precompiled/cpu",
    }
    path = rig.write(workers(rig, archs), "broken.yaml")
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--per-host", "--cluster-file", str(path))
    assert done.returncode == 1
    assert "2 of 4 build(s) failed; no envelope was published" in done.stderr
    assert "build pascal for pascal failed: cargo exited 101" in done.stderr
    assert "build ada for ada failed: cargo exited 101" in done.stderr
    assert "has no lib/" in done.stderr or "libtorch.so does not exist" in done.stderr
    assert "prebuild: cu128 (blackwell) ok" in done.stderr
    assert "prebuild: cpu (cpu-node) ok" in done.stderr
    assert not (rig.project / "target/cluster/_envelopes/ddp-bench.json").exists()
    assert "Traceback" not in done.stderr


def test_build_host_prints_its_entry(rig: RigCluster) -> None:
    path = rig.write(workers(rig), "one.yaml", docker=rig.docker_settings())
    done = rig.inv(
        "build-host",
        "--host",
        "pascal",
        "--cmd",
        "ddp-bench",
        "--json",
        "--cluster-file",
        str(path),
    )
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["pascal"]
    assert entry["bin"] == "target/cluster/pascal/builds-sm61-sm120/release/ddp-bench"
    assert entry["ld_library_path"] == f"{rig.root}/mnt-pascal/libtorch/builds/sm61-sm120/lib"
    itself = rig.inv(
        "build-host", "--host", "ctrl", "--cmd", "ddp-bench", "--cluster-file", str(path)
    )
    assert itself.returncode == 1 and "is the controller" in itself.stderr


def test_missing_image_fails_before_any_build(rig: RigCluster) -> None:
    settings = {**rig.docker_settings(), "image": "fdl-no-such-image:{cuda_tag}"}
    path = rig.write(workers(rig), "noimage.yaml", docker=settings)
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 1
    assert "Docker image(s) not found on this machine: fdl-no-such-image:12.6" in done.stderr
    assert "Compiling" not in done.stderr


def test_docker_api_error_is_one_clean_message(rig: RigCluster) -> None:
    """The daemon refuses an upper-case reference with a 400 (an APIError, not ImageNotFound)."""
    settings = {**rig.docker_settings(), "image": "FDL-Upper:{cuda_tag}"}
    path = rig.write(workers(rig), "upper.yaml", docker=settings)
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    refused = "  error    ctrl (controller, local): the Docker daemon refused to look up image"
    said = [line for line in lines if line.startswith(refused)]  # preflight's, before any build
    assert len(said) == 1 and "'FDL-Upper:" in said[0] and "must be lowercase" in said[0]
    assert lines[-1] == "fdl: preflight found errors on ctrl; nothing was built"
    assert "Traceback" not in done.stderr


def test_docker_build_as_a_non_root_user_leaves_no_root_files(rig: RigCluster) -> None:
    """The exact command prebuild runs for a non-root user, run for real as uid 4321.

    (The tests themselves run as root, so ``container_user()`` would pass no
    ``--user``; this renders the command it produces for a non-root caller.)
    """
    cluster = load_cluster(rig.write(workers(rig), "user.yaml", docker=rig.docker_settings()))
    docker = cluster.controller.docker
    assert isinstance(docker, DockerSettings)
    job = plan_builds(
        [cluster.worker("ada")], backend_for(cluster), "ddp-bench", "ddp-bench", False
    )[0]
    target = rig.project / job.target_dir
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    os.chown(target, 4321, 4321)
    command = docker_line(job, cluster.controller, docker, "usertest", "4321:4321")
    subprocess.run(command, shell=True, check=True, capture_output=True)
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in target.rglob("*")}
    assert owners == {(4321, 4321)}
    assert (target / "release/ddp-bench").is_file()


def test_arches_with_the_same_slug_never_share_a_binary(rig: RigCluster) -> None:
    """``a/b-c`` and ``a-b/c`` fold to one slug; in Docker cargo cannot tell them apart."""
    for arch in ("slug/a-cu1", "slug-a/cu1"):
        add_variant(rig.project, arch)
    for arch in ("slug/a-cu1", "slug-a/cu1"):
        archs = {"blackwell": arch}
        path = rig.write(workers(rig, archs), "slug.yaml", docker=rig.docker_settings())
        done = rig.inv(
            "prebuild", "--cmd", "ddp-bench", "--per-host", "--json", "--cluster-file", str(path)
        )
        assert done.returncode == 0, done.stderr
        assert_runs_everywhere(rig, done.stdout.strip() + "\n", archs)
