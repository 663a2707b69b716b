"""Build plans and command lines (pure)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from fdl_tasks.build.backends.compose import compose_line
from fdl_tasks.build.backends.docker_run import docker_line, resolve_image
from fdl_tasks.build.backends.native import native_line
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import NoEnvironment
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import Cluster, ComposeService, DockerSettings
from fdl_tasks.core.errors import FdlError

#: cargo's progress bar, asked for through the pipe at the end of every build's cargo line.
PROGRESS_ARGV = ["--config", 'term.progress.when="always"', "--config", "term.progress.width=200"]


def cluster(archs: dict[str, str], docker: dict[str, object] | None = None) -> Cluster:
    controller: dict[str, object] = {"path": "/srv/my proj"}
    if docker:
        controller["docker"] = docker
    workers = [{"host": h, "path": "/mnt/p", "arch": a} for h, a in archs.items()]
    return parse_cluster({"controller": controller, "workers": workers}, "c.yaml")


def _wc(c: Cluster) -> tuple[Any, Any]:
    return c.workers, backend_for(c)


def test_image_template() -> None:
    docker = DockerSettings(image="flodl:{cuda_tag}-v{cuda_version}")
    assert resolve_image(docker, docker.image, "precompiled/cu126") == "flodl:12.6-v12.6.0"
    none = resolve_image(docker, docker.image, "builds/sm61-sm120")
    assert isinstance(none, NoEnvironment) and "cuda_version" in none.reason
    fallback = DockerSettings(image="flodl:{cuda_tag}", cuda_version="12.8")
    assert resolve_image(fallback, fallback.image, "precompiled/cpu") == "flodl:12.8"
    patch = DockerSettings(image="nvidia/cuda:{cuda_version}|{cuda_tag}", cuda_version="12.6.3")
    assert resolve_image(patch, patch.image, "builds/sm61-sm120") == "nvidia/cuda:12.6.3|12.6"


def test_per_host_plan_has_one_job_per_host() -> None:
    c = cluster({"a": "precompiled/cu128", "b": "precompiled/cu128", "c": "precompiled/cpu"})
    jobs = plan_builds(c.workers, backend_for(c), "bench", "ddp-bench", shared=False)
    assert [(j.name, j.hosts, j.target_dir) for j in jobs] == [
        ("a", ("a",), "target/cluster/a/precompiled-cu128"),
        ("b", ("b",), "target/cluster/b/precompiled-cu128"),
        ("c", ("c",), "target/cluster/c/precompiled-cpu"),
    ]
    assert jobs[2].build.features == () and jobs[0].build.features == ("cuda",)


def test_shared_plan_has_one_job_per_distinct_build() -> None:
    archs = {f"n{i:02}": ("precompiled/cu128" if i % 2 else "builds/sm61-sm120") for i in range(16)}
    jobs = plan_builds(*_wc(cluster(archs)), "bench", "", shared=True)
    assert len(jobs) == 2
    assert sorted(len(j.hosts) for j in jobs) == [8, 8]
    for job in jobs:
        assert job.target_dir.startswith("target/cluster/_shared/")
        assert job.host_binary(job.hosts[0]) == (
            f"target/cluster/{job.hosts[0]}/{job.build.arch.replace('/', '-')}/release/bench"
        )


def test_arch_change_moves_a_host_to_a_new_build_dir() -> None:
    before = plan_builds(*_wc(cluster({"a": "precompiled/cu128"})), "x", "", True)
    after = plan_builds(*_wc(cluster({"a": "precompiled/cu126"})), "x", "", True)
    assert before[0].target_dir != after[0].target_dir


def test_docker_command_is_quoted_and_complete() -> None:
    c = cluster(
        {"a": "precompiled/cu128"},
        {"image": "flodl:{cuda_tag}", "env": {"X": "a b"}, "run_args": ["--gpus", "all"]},
    )
    assert isinstance(c.controller.docker, DockerSettings)
    job = plan_builds(c.workers, backend_for(c), "bench", "ddp-bench", False)[0]
    argv = shlex.split(docker_line(job, c.controller, c.controller.docker, "r1", "1000:1000"))
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
    assert argv[-4:] == PROGRESS_ARGV
    assert argv[-14:-4] == [
        "--gpus",
        "all",
        "flodl:12.8",
        "cargo",
        "build",
        "--release",
        "--features",
        "cuda",
        "--bin",
        "bench",
    ]


def test_native_command() -> None:
    c = cluster({"a": "precompiled/cpu"})
    job = plan_builds(c.workers, backend_for(c), "bench", "", False)[0]
    command = native_line(job, c.controller)
    assert command == (
        "cd '/srv/my proj' && exec setsid env "
        "'LIBTORCH_PATH=/srv/my proj/libtorch/precompiled/cpu' "
        "'CARGO_TARGET_DIR=/srv/my proj/target/cluster/a/precompiled-cpu' "
        "cargo build --release --bin bench " + shlex.join(PROGRESS_ARGV)
    )


FLODL_INNER = (
    "cd /workspace/ddp-bench && CARGO_TARGET_DIR=/workspace/target/cluster/{target} "
    "cargo build --release {features}--bin ddp-bench " + shlex.join(PROGRESS_ARGV)
)


def compose_job(arch: str) -> tuple[list[str], dict[str, str], Cluster]:
    """The rendered compose command split into (compose argv, its environment, cluster)."""
    c = parse_cluster(
        {
            "controller": {"path": "/srv/proj", "docker": "cuda"},
            "workers": [{"host": "node-b", "path": "/mnt/p", "arch": arch}],
        },
        "c.yaml",
    )
    assert isinstance(c.controller.docker, ComposeService)
    job = plan_builds(c.workers, backend_for(c), "ddp-bench", "ddp-bench", False)[0]
    line = compose_line(job, c.controller, c.controller.docker, ["docker", "compose"], "r1", (7, 8))
    prefix, _, rest = line.partition(" && exec ")
    assert prefix == "cd /srv/proj"  # flodl runs compose from the project root
    argv = shlex.split(rest)
    assert argv[0] == "env"
    split = argv.index("docker")
    return argv[split:], dict(a.split("=", 1) for a in argv[1:split]), c


@pytest.mark.parametrize(
    ("variable", "arch", "value"),
    [
        ("LIBTORCH_HOST_PATH", "precompiled/cu128", "/srv/proj/libtorch/precompiled/cu128"),
        ("LIBTORCH_CPU_PATH", "precompiled/cu128", "./libtorch/precompiled/cpu"),
        ("CUDA_VERSION", "precompiled/cu128", "12.8.0"),
        ("CUDA_VERSION", "precompiled/cu118", "11.8.0"),
        ("CUDA_TAG", "precompiled/cu126", "12.6"),
        ("CUDA_VERSION", "builds/sm61-sm120", None),  # flodl sets none: compose defaults
        ("CUDA_TAG", "precompiled/cpu", None),
        ("UID", "precompiled/cpu", "7"),
        ("GID", "precompiled/cpu", "8"),
    ],
)
def test_compose_environment_matches_flodl(variable: str, arch: str, value: str | None) -> None:
    _, environment, _ = compose_job(arch)
    assert environment.get(variable) == value


@pytest.mark.parametrize(
    ("arch", "features"), [("precompiled/cu128", "--features cuda "), ("precompiled/cpu", "")]
)
def test_compose_command_runs_flodls_inner_script(arch: str, features: str) -> None:
    argv, _, _ = compose_job(arch)
    slug = arch.replace("/", "-")
    assert argv[:6] == ["docker", "compose", "run", "--rm", "-T", "--name"]
    assert argv[argv.index("--label") : argv.index("--label") + 2] == [
        "--label",
        "fdl-tasks.run=r1",
    ]
    assert argv[-4:] == [
        "cuda",
        "bash",
        "-c",
        FLODL_INNER.format(target=f"node-b/{slug}", features=features),
    ]


def test_compose_v1_is_the_same_command() -> None:
    c = compose_job("precompiled/cu128")[2]
    assert isinstance(c.controller.docker, ComposeService)
    job = plan_builds(c.workers, backend_for(c), "ddp-bench", "ddp-bench", False)[0]
    v1 = compose_line(job, c.controller, c.controller.docker, ["docker-compose"], "r1", (7, 8))
    assert " docker-compose run --rm -T " in v1


def test_features_follow_the_vendor_and_the_worker_key() -> None:
    c = parse_cluster(
        {
            "controller": {"path": "/p"},
            "workers": [
                {"host": "amd", "path": "/p", "arch": "precompiled/rocm6.2"},
                {"host": "nv", "path": "/p", "arch": "builds/sm61-sm120"},
                {"host": "mine", "path": "/p", "arch": "builds/mybuild", "features": ["rocm"]},
                {"host": "cpu", "path": "/p", "arch": "precompiled/cu128", "features": []},
            ],
        },
        "c.yaml",
    )
    jobs = {j.hosts[0]: j.build.features for j in plan_builds(*_wc(c), "t", "", False)}
    assert jobs == {"amd": ("rocm",), "nv": ("cuda",), "mine": ("rocm",), "cpu": ()}


def test_a_bad_feature_name_is_refused_with_its_key() -> None:
    with pytest.raises(FdlError, match=r"workers\[0\]\.features"):
        parse_cluster(
            {
                "controller": {"path": "/p"},
                "workers": [{"host": "a", "path": "/p", "arch": "x/cu128", "features": ["a b"]}],
            },
            "c.yaml",
        )


MIXED = {"nv": "precompiled/cu128", "amd": "precompiled/rocm6.2", "cpu": "precompiled/cpu"}


def test_one_environment_for_nvidia_and_amd_is_refused_before_any_build() -> None:
    c = cluster(MIXED, {"image": "flodl-cuda:{cuda_tag}"})
    with pytest.raises(FdlError, match=r"NVIDIA: nv; AMD: amd.*gpu_builds: \{amd: \{image"):
        plan_builds(*_wc(c), "t", "", True)
    flodl = cluster({"amd": "precompiled/rocm6.2"}, {"image": "rocm:6.2"})  # one vendor: as before
    assert plan_builds(*_wc(flodl), "t", "", True)[0].build.environment.toolchain == "rocm:6.2"
    native = cluster(MIXED)  # native cargo builds every vendor
    assert len(plan_builds(*_wc(native), "t", "", True)) == 3


def test_each_vendor_gets_its_own_image_or_service() -> None:
    c = parse_cluster(
        {
            "controller": {
                "path": "/p",
                "docker": {"image": "flodl-cuda:{cuda_tag}", "cuda_version": "12.6"},
                "gpu_builds": {"amd": {"image": "flodl-rocm:6.2"}},
            },
            "workers": [{"host": h, "path": "/p", "arch": a} for h, a in MIXED.items()],
        },
        "c.yaml",
    )
    images = {
        j.hosts[0]: j.build.environment.toolchain for j in plan_builds(*_wc(c), "t", "", True)
    }
    assert images == {"nv": "flodl-cuda:12.8", "amd": "flodl-rocm:6.2", "cpu": "flodl-cuda:12.6"}
    compose = parse_cluster(
        {
            "controller": {
                "path": "/p",
                "docker": "cuda",
                "gpu_builds": {"amd": {"service": "rocm"}},
            },
            "workers": [{"host": h, "path": "/p", "arch": a} for h, a in MIXED.items()],
        },
        "c.yaml",
    )
    services = {
        j.hosts[0]: j.build.environment.toolchain for j in plan_builds(*_wc(compose), "t", "", True)
    }
    assert services == {"nv": "cuda", "amd": "rocm", "cpu": "cuda"}
    wrong = attrs_evolve_builds(compose, image="x")
    with pytest.raises(FdlError, match=r"gpu_builds\.amd needs a 'service:'"):
        plan_builds(*_wc(wrong), "t", "", True)


def attrs_evolve_builds(c: Cluster, **build: str) -> Cluster:
    import attrs

    from fdl_tasks.config.model import VendorBuild

    controller = attrs.evolve(c.controller, gpu_builds={"amd": VendorBuild(**build)})
    return attrs.evolve(c, controller=controller)


@pytest.mark.parametrize(
    ("builds", "message"),
    [
        (
            {"intel": {"image": "x"}},
            "gpu_builds['intel']: GPU vendor 'intel' must be 'nvidia' or 'amd'",
        ),
        ({"amd": "rocm"}, "gpu_builds['amd']: expected a mapping"),
        ({"amd": {"image": "-x"}}, "gpu_builds['amd'].image: image '-x' must be an image name"),
    ],
)
def test_bad_gpu_builds_name_their_key(builds: dict[str, object], message: str) -> None:
    controller = {"path": "/p", "docker": {"image": "i"}, "gpu_builds": builds}
    with pytest.raises(FdlError) as caught:
        parse_cluster({"controller": controller, "workers": []}, "c.yaml")
    assert message in str(caught.value)
