"""The build environment as a value, chosen by the backend of the controller's mode (pure)."""

from __future__ import annotations

from typing import Any

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import BuildEnvironment, NoEnvironment
from fdl_tasks.build.build_plan import build_environment, live_target_dirs
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import Cluster


def cluster(docker: Any, **controller: Any) -> Cluster:
    settings: dict[str, Any] = {"path": "/srv/p", "docker": docker, **controller}
    return parse_cluster(
        {
            "controller": settings,
            "workers": [
                {"host": "nv", "path": "/p", "arch": "precompiled/cu128"},
                {"host": "amd", "path": "/p", "arch": "precompiled/rocm6.2"},
                {"host": "cpu", "path": "/p", "arch": "precompiled/cpu"},
            ],
        },
        "c.yaml",
    )


def test_a_worker_without_an_environment_is_a_value_and_has_no_dirs() -> None:
    c = cluster({"image": "cuda:{cuda_tag}"})  # the CPU variant encodes no CUDA release
    backend = backend_for(c)
    none = build_environment(c.worker("cpu"), backend)
    assert isinstance(none, NoEnvironment) and "cuda_version" in none.reason
    live = live_target_dirs(c.workers, backend)
    assert not any("/cpu/" in d or d.endswith("/cpu") for d in live)
    assert "target/cluster/nv/precompiled-cu128" in live


def test_each_mode_chooses_the_toolchain_cross_then_vendor_then_main() -> None:
    gpu = {"amd": {"image": "rocm:6.2"}}
    cross = {"aarch64": {"image": "arm:{cuda_tag}"}, "riscv64": {"image": "riscv"}}
    docker = cluster({"image": "cuda:12.8"}, gpu_builds=gpu, cross=cross)
    backend = backend_for(docker)
    environments = {w.host: build_environment(w, backend) for w in docker.workers}
    assert {h: e.toolchain for h, e in environments.items() if isinstance(e, BuildEnvironment)} == {
        "nv": "cuda:12.8",
        "amd": "rocm:6.2",
        "cpu": "cuda:12.8",
    }
    arm = build_environment(docker.worker("nv"), backend, "aarch64")
    assert isinstance(arm, BuildEnvironment) and arm.toolchain == "arm:12.8"
    assert arm.cpu_arch == "aarch64" and arm.key.environment == "arm:12.8"
    riscv = build_environment(docker.worker("amd"), backend, "riscv64")  # cross before vendor
    assert isinstance(riscv, BuildEnvironment) and riscv.toolchain == "riscv"
    compose = cluster("cuda", gpu_builds={"amd": {"service": "rocm"}})
    services = {w.host: build_environment(w, backend_for(compose)) for w in compose.workers}
    assert {h: getattr(e, "toolchain", None) for h, e in services.items()} == {
        "nv": "cuda",
        "amd": "rocm",
        "cpu": "cuda",
    }
    native = build_environment(cluster(None).worker("amd"), backend_for(cluster(None)))
    assert native == BuildEnvironment("native", "precompiled/rocm6.2", ("rocm",), "", "amd")


def test_the_mount_table_is_the_backends() -> None:
    docker = backend_for(cluster({"image": "img", "workspace": "/w", "libtorch": "/lt"}))
    assert docker.mounts() == [("/w", "/srv/p"), ("/lt", None)]
    assert backend_for(cluster("cuda")).mounts() == [("/workspace", "/srv/p")]
    assert backend_for(cluster(None)).mounts() == []
