"""Preflight checks what prebuild needs, before any build (issue 31, deliver 1): through the
real ``inv`` against real sshd hosts, the controller's real cargo, rustc and Docker SDK.

On the controller: ``controller.path``, each variant, the build tool (the Docker
daemon, cargo on PATH), a native cross target's ``std``. On each host, in the same
single round trip: its ``path``, ``<path>/libtorch/<arch>/lib``, the command's
working directory. The aarch64 host only says aarch64 (a ``uname -m`` shim on its
real sshd), which is all preflight asks.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

ARCH = "precompiled/cpu"
HOSTS = [
    HostSpec("good", "127.0.0.240"),
    HostSpec("typo", "127.0.0.241"),
    HostSpec("arm", "127.0.0.242", uname_m="aarch64"),
]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("readiness"), HOSTS, [ARCH]) as cluster:
        yield cluster


def host(rig: RigCluster, name: str, **fields: Any) -> dict[str, Any]:
    return rig.worker(name, **{"arch": ARCH, **fields})


def verdicts(stdout: str) -> dict[str, dict[str, Any]]:
    return {v["host"]: v for v in json.loads(stdout)}


def preflight(rig: RigCluster, path: Path, env: dict[str, str] | None = None) -> Any:
    return rig.inv("preflight", "--json", "--cluster-file", str(path), env=env)


def prebuild(rig: RigCluster, path: Path, env: dict[str, str] | None = None) -> Any:
    return rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env=env)


def sessions(rig: RigCluster, name: str) -> int:
    """Sessions the host's sshd has started so far (its log, at LogLevel VERBOSE)."""
    return rig.rig.log_path(name).read_text(errors="replace").count("Starting session")


def assert_refused_before_building(done: Any) -> None:
    assert done.returncode == 1, done.stderr
    assert "nothing was built" in done.stderr
    assert "Compiling" not in done.stderr and "Traceback" not in done.stderr


def test_controller_path_absent_here(rig: RigCluster) -> None:
    """The quick start's ``controller.path: /srv/proj``, absent on this machine."""
    absent = rig.root / "srv-proj"
    path = rig.write([host(rig, "good")], "noroot.yaml", path=str(absent))
    done = preflight(rig, path)
    assert done.returncode == 1, done.stderr
    ctrl = verdicts(done.stdout)["ctrl"]
    expected = f"controller.path {absent} in {path} does not exist on this machine"
    assert ctrl["status"] == "error" and expected in ctrl["errors"][0], ctrl
    assert len(ctrl["errors"]) == 1, ctrl  # the variant and tool checks follow from it
    assert f"error    ctrl (controller, local): {expected}" in done.stderr
    # inv preflight never builds: its last line does not say so.
    assert done.stderr.endswith("fdl: preflight found errors on ctrl\n"), done.stderr
    built = prebuild(rig, path)
    assert built.returncode == 1 and expected in built.stderr, built.stderr
    assert "--crate-dir" not in built.stderr


def test_no_cargo_toml_names_controller_path(rig: RigCluster) -> None:
    empty = rig.root / "not-the-project"
    empty.mkdir(exist_ok=True)
    path = rig.write([host(rig, "good")], "empty.yaml", path=str(empty))
    done = prebuild(rig, path)
    assert done.returncode == 1
    assert f"no Cargo.toml in {empty}: is controller.path in {path} the project root?" in (
        done.stderr
    )


def test_worker_path_typo_is_an_error_there_in_one_round_trip(rig: RigCluster) -> None:
    typo = str(rig.project) + "-typo"
    path = rig.write([host(rig, "good"), host(rig, "typo", path=typo)], "typo.yaml")
    before = {name: sessions(rig, name) for name in ("good", "typo")}
    done = preflight(rig, path)
    assert done.returncode == 1, done.stderr
    got = verdicts(done.stdout)
    assert got["good"]["status"] == "ok", got["good"]
    assert got["typo"]["status"] == "error"
    assert got["typo"]["errors"] == [
        f"path {typo} does not exist on this host: fix this worker's 'path' in {path} "
        "(the project root as this host sees it)"
    ]
    # Still one round trip per host, the new checks included.
    assert {name: sessions(rig, name) - n for name, n in before.items()} == {"good": 1, "typo": 1}
    built = prebuild(rig, path)
    assert_refused_before_building(built)
    assert f"error    typo: path {typo} does not exist on this host" in built.stderr
    assert "fdl: preflight found errors on typo; nothing was built" in built.stderr


def test_dry_prebuild_prints_the_probe_it_would_send(rig: RigCluster) -> None:
    """``inv --dry prebuild`` lists each host's probe as the real run sends it: with the
    command known, the check of the command's directory on that host."""
    path = rig.write([host(rig, "good")], "dry.yaml")
    done = rig.inv("--dry", "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = [text for text in done.stderr.splitlines() if text.startswith("[good] ssh ")]
    assert "echo workdir=ok" in line and f"{rig.project}/ddp-bench" in line


def test_host_without_the_variant_or_the_command_dir(rig: RigCluster) -> None:
    """A host whose ``path`` exists but is not the project: its variant is missing there
    (preflight); the project's libtorch but no crate dir: refused once the command is
    known (prebuild)."""
    bare = rig.root / "bare"
    bare.mkdir(exist_ok=True)
    libtorch_only = rig.root / "libtorch-only"
    libtorch_only.mkdir(exist_ok=True)
    if not (libtorch_only / "libtorch").exists():
        (libtorch_only / "libtorch").symlink_to(rig.project / "libtorch")
    path = rig.write([host(rig, "typo", path=str(bare))], "bare.yaml")
    got = verdicts(preflight(rig, path).stdout)["typo"]
    assert got["errors"] == [
        f"libtorch variant not found at {bare}/libtorch/{ARCH}/lib in this host's view of the "
        f"project: a typo in this worker's 'path' or 'arch' in {path}, or the shared mount is "
        "not the controller's project?"
    ]
    path = rig.write([host(rig, "typo", path=str(libtorch_only))], "nocrate.yaml")
    assert preflight(rig, path).returncode == 0  # no command, no working directory to ask
    built = prebuild(rig, path)
    assert_refused_before_building(built)
    assert (
        f"error    typo: the command's working directory {libtorch_only}/ddp-bench does not "
        "exist on this host" in built.stderr
    )


def test_missing_variant_on_the_controller(rig: RigCluster) -> None:
    path = rig.write([host(rig, "good", arch="precompiled/cu999")], "novariant.yaml")
    done = preflight(rig, path)
    assert done.returncode == 1
    lib = rig.project / "libtorch/precompiled/cu999/lib"
    assert verdicts(done.stdout)["ctrl"]["errors"] == [
        f"libtorch variant(s) not found on the controller (a typo in 'arch'?): "
        f"good (arch precompiled/cu999): {lib}"
    ]


@pytest.mark.docker
def test_an_arch_typo_is_one_error_not_also_its_image(rig: RigCluster) -> None:
    """The build image is named after the arch (its CUDA tag): a typo in 'arch' is said
    once, as the missing variant, not again as an image of that tag missing."""
    docker = {"image": "fdl-rig-none:{cuda_tag}"}
    path = rig.write([host(rig, "good", arch="precompiled/cu999")], "typoimage.yaml", docker=docker)
    done = preflight(rig, path)
    assert done.returncode == 1, done.stderr
    lib = rig.project / "libtorch/precompiled/cu999/lib"
    assert verdicts(done.stdout)["ctrl"]["errors"] == [
        f"libtorch variant(s) not found on the controller (a typo in 'arch'?): "
        f"good (arch precompiled/cu999): {lib}"
    ]


def test_a_controller_arch_typo_is_a_warning_that_names_the_variant_meant(rig: RigCluster) -> None:
    """``controller.arch`` is flodl's (its launcher builds against it): a typo there is
    said by preflight, with the installed variant it was likely meant to be, and blocks
    nothing of ours; a good one says nothing."""
    typo = ARCH + "x"  # the rig's one variant, mistyped
    path = rig.write([host(rig, "good")], "ctrlarch.yaml", arch=typo)
    done = preflight(rig, path)
    assert done.returncode == 0, done.stderr
    controller = verdicts(done.stdout)["ctrl"]
    assert controller["status"] == "warning" and controller["errors"] == []
    lib = rig.project / "libtorch" / typo / "lib"
    assert [w for w in controller["warnings"] if "controller.arch" in w] == [
        f"controller.arch {typo!r} in {path} names no libtorch variant on this "
        f"machine: {lib} is missing (did you mean {ARCH!r}?). fdl-tasks' builds "
        "do not use it (each host's own 'arch' decides), but flodl's launcher builds against "
        "it before a run (fdl @<env>)"
    ]
    good = rig.write([host(rig, "good")], "ctrlarchok.yaml", arch=ARCH)
    done = preflight(rig, good)
    assert done.returncode == 0, done.stderr
    assert not any("controller.arch" in w for w in verdicts(done.stdout)["ctrl"]["warnings"])


def test_docker_daemon_unreachable(rig: RigCluster) -> None:
    docker = {"image": "fdl-rig-none:{cuda_tag}", "cuda_version": "12.8"}
    path = rig.write([host(rig, "good")], "nodaemon.yaml", docker=docker)
    done = preflight(rig, path, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert done.returncode == 1, done.stderr
    (error,) = verdicts(done.stdout)["ctrl"]["errors"]
    assert error.startswith("the Docker daemon does not answer"), error
    assert f"remove controller.docker from {path}" in error


def test_no_cargo_on_path(rig: RigCluster) -> None:
    """Native mode on a controller whose PATH holds only ``sh`` (the local probe's)."""
    bare_bin = rig.root / "bin-without-cargo"
    bare_bin.mkdir(exist_ok=True)
    if not (bare_bin / "sh").exists():
        (bare_bin / "sh").symlink_to("/bin/sh")
    path = rig.write([host(rig, "good")], "nocargo.yaml")
    done = preflight(rig, path, env={"PATH": str(bare_bin)})
    assert done.returncode == 1, done.stderr
    (error,) = verdicts(done.stdout)["ctrl"]["errors"]
    assert error.startswith("cargo is not on PATH: install Rust"), error


#: A target neither rustup's default toolchain nor Debian's rustc ships a std for.
TARGET = "aarch64-unknown-linux-musl"


def rustc_has_std(target: str) -> bool:
    answer = subprocess.run(
        ["rustc", "--print", "target-libdir", "--target", target],
        capture_output=True,
        text=True,
        check=False,
    )
    libdir = Path(answer.stdout.strip())
    return answer.returncode == 0 and libdir.is_dir() and any(libdir.glob("libstd-*.rlib"))


def test_native_cross_target_without_std(rig: RigCluster) -> None:
    """An aarch64 host found by the probe (no ``cpu_arch`` pin), a native cross setup for a
    target whose std this machine's rustc lacks: a controller error before any build."""
    if rustc_has_std(TARGET):
        pytest.skip(f"this machine's rustc has the {TARGET} std")
    path = rig.write([host(rig, "arm")], "nostd.yaml", cross={"aarch64": {"target": TARGET}})
    done = preflight(rig, path, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 1, done.stderr
    got = verdicts(done.stdout)
    assert got["arm"]["status"] == "ok", got["arm"]
    (error,) = got["ctrl"]["errors"]
    assert error.startswith(
        "native cross build(s) without the Rust standard library of their target: "
        f"{TARGET} (for aarch64 hosts): "
    ), error
    assert f"rustup target add {TARGET}" in error
    assert_refused_before_building(prebuild(rig, path))
