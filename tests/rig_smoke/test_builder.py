"""Smoke tests of the build rig: fixture project, native cargo build, docker build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from rig import docker_builder
from rig.project import add_variant, break_variant, libtorch_dir, make_project

pytestmark = pytest.mark.docker

VARIANTS = ("precompiled/cu128", "precompiled/cu126", "builds/sm61-sm120", "precompiled/cpu")
USER = (1000, 1000)
IMAGE_TAG = "12.8"


def _cargo() -> str:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).exists():
        pytest.skip("cargo is not installed")
    return cargo


def _run(
    cmd: list[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("LD_LIBRARY_PATH", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        cmd, env=full_env, cwd=cwd, capture_output=True, text=True, check=False, timeout=600
    )


def _native_build(proj: Path, arch: str, target: Path, features: list[str]) -> Path:
    proc = _run(
        [_cargo(), "build", "--release", "--bin", "ddp-bench", *features],
        env={"LIBTORCH_PATH": str(libtorch_dir(proj, arch)), "CARGO_TARGET_DIR": str(target)},
        cwd=proj / "ddp-bench",
    )
    assert proc.returncode == 0, proc.stderr
    return target / "release" / "ddp-bench"


@pytest.fixture(scope="session")
def builder_image() -> str:
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        pytest.skip("docker/dockerd are not installed")
    docker_builder.ensure_dockerd()
    return docker_builder.ensure_builder_image(tags=("latest", IMAGE_TAG))


@pytest.fixture()
def project(tmp_path: Path) -> Iterator[Path]:
    yield make_project(tmp_path / "proj", VARIANTS)


def test_make_project_layout_and_idempotence(project: Path) -> None:
    assert (project / "Cargo.toml").is_file()
    assert (project / "ddp-bench" / "build.rs").is_file()
    assert not (project / "target").exists()
    libs = {arch: libtorch_dir(project, arch) / "lib" / "libtorch.so" for arch in VARIANTS}
    for arch, lib in libs.items():
        assert lib.is_file(), arch
        assert arch.encode() in lib.read_bytes()
    before = {arch: lib.stat().st_mtime_ns for arch, lib in libs.items()}

    (project / "target").mkdir()
    (project / "target" / "keep").write_text("x")
    assert make_project(project, VARIANTS) == project
    assert {arch: lib.stat().st_mtime_ns for arch, lib in libs.items()} == before
    assert (project / "target" / "keep").read_text() == "x"

    arch_dir = add_variant(project, "precompiled/cu118")
    assert (arch_dir / "lib" / "libtorch.so").is_file()
    assert break_variant(project, "precompiled/cu118") == arch_dir
    assert arch_dir.is_dir()
    assert not (arch_dir / "lib").exists()


def test_native_build_needs_the_right_ld_library_path(project: Path) -> None:
    target = project / "target" / "cluster" / "native" / "precompiled-cu126"
    binary = _native_build(project, "precompiled/cu126", target, ["--features", "cuda"])
    lib = libtorch_dir(project, "precompiled/cu126") / "lib"

    ok = _run([str(binary), "--steps", "3"], env={"LD_LIBRARY_PATH": str(lib)})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        "ddp-bench variant=precompiled/cu126 cuda=on",
        "args=--steps 3",
    ]

    # No rpath: without LD_LIBRARY_PATH the loader cannot find libtorch.so.
    bad = _run([str(binary)])
    assert bad.returncode != 0
    assert "libtorch.so" in bad.stderr

    # The loader takes whichever variant it is pointed at.
    other = _run(
        [str(binary)], env={"LD_LIBRARY_PATH": str(libtorch_dir(project, VARIANTS[2]) / "lib")}
    )
    assert other.stdout.splitlines()[0] == f"ddp-bench variant={VARIANTS[2]} cuda=on"


def test_native_cpu_build_has_cuda_off(project: Path) -> None:
    target = project / "target" / "cluster" / "native" / "precompiled-cpu"
    binary = _native_build(project, "precompiled/cpu", target, [])
    lib = libtorch_dir(project, "precompiled/cpu") / "lib"
    out = _run([str(binary)], env={"LD_LIBRARY_PATH": str(lib)})
    assert out.stdout.splitlines() == ["ddp-bench variant=precompiled/cpu cuda=off", "args="]


def test_native_build_fails_clearly_without_lib_dir(project: Path) -> None:
    break_variant(project, "precompiled/cu128")
    proc = _run(
        [_cargo(), "build", "--release", "--bin", "ddp-bench"],
        env={
            "LIBTORCH_PATH": str(libtorch_dir(project, "precompiled/cu128")),
            "CARGO_TARGET_DIR": str(project / "target" / "broken"),
        },
        cwd=project / "ddp-bench",
    )
    assert proc.returncode != 0
    assert "has no lib/ directory" in proc.stderr


def test_docker_build_as_non_root_user(builder_image: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chowning the project to 1000:1000 needs root")
    arch = "precompiled/cu128"
    proj = make_project(tmp_path / "proj", [arch], owner=USER)
    lib_root = libtorch_dir(proj, arch)
    target_rel = "target/cluster/x/precompiled-cu128"
    cmd = [
        "docker",
        "run",
        "--rm",
        *docker_builder.toolchain_run_args(),
        "-v",
        f"{proj}:/workspace",
        "-v",
        f"{lib_root}:/opt/libtorch:ro",
        "-e",
        "LIBTORCH_PATH=/opt/libtorch",
        "-e",
        f"CARGO_TARGET_DIR=/workspace/{target_rel}",
        "-w",
        "/workspace/ddp-bench",
        "--user",
        f"{USER[0]}:{USER[1]}",
        f"{builder_image}:{IMAGE_TAG}",
        "cargo",
        "build",
        "--release",
        "--bin",
        "ddp-bench",
        "--features",
        "cuda",
    ]
    proc = _run(cmd)
    assert proc.returncode == 0, proc.stderr

    binary = proj / target_rel / "release" / "ddp-bench"
    ok = _run([str(binary), "a", "b"], env={"LD_LIBRARY_PATH": str(lib_root / "lib")})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [f"ddp-bench variant={arch} cuda=on", "args=a b"]
    assert _run([str(binary)]).returncode != 0

    wrong_owner = [
        str(p) for p in [proj, *proj.rglob("*")] if (p.lstat().st_uid, p.lstat().st_gid) != USER
    ]
    assert wrong_owner == []
    assert (binary.stat().st_uid, binary.stat().st_gid) == USER


def test_dockerd_is_never_started_from_a_private_network_namespace() -> None:
    """A daemon started under ``unshare --net`` would keep that namespace for every
    container's ``--network host``; the rig refuses to start one there."""
    probe = "from rig.docker_builder import _in_private_network_namespace as f; print(f())"
    here = _run([sys.executable, "-c", probe])
    inside = _run(["unshare", "--net", sys.executable, "-c", probe])
    assert (here.stdout, inside.stdout) == ("False\n", "True\n"), (here.stderr, inside.stderr)
