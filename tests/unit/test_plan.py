"""Build plans and command lines (pure)."""

from __future__ import annotations

import shlex

import pytest

from fdl_tasks.errors import FdlError
from fdl_tasks.loader import parse_cluster
from fdl_tasks.model import Cluster, DockerSettings
from fdl_tasks.plan import docker_command, native_command, plan_builds, resolve_image


def cluster(archs: dict[str, str], docker: dict[str, object] | None = None) -> Cluster:
    controller: dict[str, object] = {"path": "/srv/my proj"}
    if docker:
        controller["docker"] = docker
    workers = [{"host": h, "path": "/mnt/p", "arch": a} for h, a in archs.items()]
    return parse_cluster({"controller": controller, "workers": workers}, "c.yaml")


def test_image_template() -> None:
    docker = DockerSettings(image="flodl:{cuda_tag}-v{cuda_version}")
    assert resolve_image(docker, "precompiled/cu126") == "flodl:12.6-v12.6"
    with pytest.raises(FdlError, match="cuda_version"):
        resolve_image(docker, "builds/sm61-sm120")
    fallback = DockerSettings(image="flodl:{cuda_tag}", cuda_version="12.8")
    assert resolve_image(fallback, "precompiled/cpu") == "flodl:12.8"


def test_per_host_plan_has_one_job_per_host() -> None:
    c = cluster({"a": "precompiled/cu128", "b": "precompiled/cu128", "c": "precompiled/cpu"})
    jobs = plan_builds(c.workers, None, "bench", "ddp-bench", shared=False)
    assert [(j.name, j.hosts, j.target_dir) for j in jobs] == [
        ("a", ("a",), "target/cluster/a/precompiled-cu128"),
        ("b", ("b",), "target/cluster/b/precompiled-cu128"),
        ("c", ("c",), "target/cluster/c/precompiled-cpu"),
    ]
    assert jobs[2].spec.features == () and jobs[0].spec.features == ("cuda",)


def test_shared_plan_has_one_job_per_distinct_build() -> None:
    archs = {f"n{i:02}": ("precompiled/cu128" if i % 2 else "builds/sm61-sm120") for i in range(16)}
    jobs = plan_builds(cluster(archs).workers, None, "bench", "", shared=True)
    assert len(jobs) == 2
    assert sorted(len(j.hosts) for j in jobs) == [8, 8]
    for job in jobs:
        assert job.target_dir.startswith("target/cluster/_shared/")
        assert job.host_binary(job.hosts[0]) == (
            f"target/cluster/{job.hosts[0]}/{job.spec.arch.replace('/', '-')}/release/bench"
        )


def test_arch_change_moves_a_host_to_a_new_build_dir() -> None:
    before = plan_builds(cluster({"a": "precompiled/cu128"}).workers, None, "x", "", True)
    after = plan_builds(cluster({"a": "precompiled/cu126"}).workers, None, "x", "", True)
    assert before[0].target_dir != after[0].target_dir


def test_docker_command_is_quoted_and_complete() -> None:
    c = cluster(
        {"a": "precompiled/cu128"},
        {"image": "flodl:{cuda_tag}", "env": {"X": "a b"}, "run_args": ["--gpus", "all"]},
    )
    assert c.controller.docker is not None
    job = plan_builds(c.workers, c.controller.docker, "bench", "ddp-bench", False)[0]
    argv = shlex.split(docker_command(job, c.controller, c.controller.docker, "r1", "1000:1000"))
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("--label") : argv.index("--label") + 2] == [
        "--label",
        "fdl-tasks.run=r1",
    ]
    assert "-v" in argv and "/srv/my proj:/workspace" in argv
    assert "/srv/my proj/libtorch/precompiled/cu128:/opt/libtorch:ro" in argv
    assert argv[argv.index("-w") + 1] == "/workspace/ddp-bench"
    assert "CARGO_TARGET_DIR=/workspace/target/cluster/a/precompiled-cu128" in argv
    assert "LIBTORCH_PATH=/opt/libtorch" in argv and "X=a b" in argv
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert argv[-10:] == [
        "--gpus",
        "all",
        "flodl:12.8",
        "cargo",
        "build",
        "--release",
        "--bin",
        "bench",
        "--features",
        "cuda",
    ]


def test_native_command() -> None:
    c = cluster({"a": "precompiled/cpu"})
    job = plan_builds(c.workers, None, "bench", "", False)[0]
    command = native_command(job, c.controller)
    assert command == (
        "cd '/srv/my proj' && exec setsid env "
        "'LIBTORCH_PATH=/srv/my proj/libtorch/precompiled/cpu' "
        "'CARGO_TARGET_DIR=/srv/my proj/target/cluster/a/precompiled-cpu' "
        "cargo build --release --bin bench"
    )
