"""Cross builds for hosts of another CPU architecture: configuration, plans, gate, checks."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.build.backends.compose import compose_line
from fdl_tasks.build.backends.docker_run import docker_line
from fdl_tasks.build.backends.native import native_line
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import Cluster, ComposeService, DockerSettings
from fdl_tasks.core.binary_files import elf_machine, file_machine
from fdl_tasks.core.errors import FdlError
from fdl_tasks.preflight.probe import ControllerAbi, ProbeFacts, ProbeRequest, judge
from fdl_tasks.publish.verification import RemoteCopy, copy_problems

ARM = "aarch64-unknown-linux-gnu"
#: The aarch64 hosts' libtorch: a directory of its own on the controller.
ARM_VARIANT = "precompiled/cu128-arm"
BOTH = {"gh200": "aarch64", "spark": "aarch64"}


def cluster(docker: Any = None, cross: Any = None, **arm: Any) -> Cluster:
    controller: dict[str, Any] = {"path": "/srv/p"}
    if docker is not None:
        controller["docker"] = docker
    if cross is not None:
        controller["cross"] = cross
    workers = [
        {"host": "x1", "path": "/m", "arch": "precompiled/cu128"},
        {"host": "x2", "path": "/m", "arch": "precompiled/cu126"},
        {"host": "gh200", "path": "/m", "arch": ARM_VARIANT, **arm},
        {"host": "spark", "path": "/m", "arch": ARM_VARIANT},
    ]
    return parse_cluster({"controller": controller, "workers": workers}, "c.yaml")


def plan(c: Cluster, machines: dict[str, str], shared: bool = True) -> list[Any]:
    return plan_builds(c.workers, backend_for(c), "bench", "", shared, cpu_archs=machines)


def test_one_build_per_variant_and_cpu_architecture() -> None:
    c = cluster(cross={"aarch64": {}})
    jobs = plan(c, BOTH)
    by_hosts = {job.hosts: job for job in jobs}
    assert sorted(by_hosts) == [("gh200", "spark"), ("x1",), ("x2",)]
    arm = by_hosts[("gh200", "spark")]
    assert arm.build.cross is not None and arm.build.cross.target == ARM
    assert arm.build.cross.linker == "aarch64-linux-gnu-gcc"
    assert arm.target_dir.startswith("target/cluster/_shared/precompiled-cu128-arm-aarch64-")
    assert arm.built_binary == f"{arm.target_dir}/{ARM}/release/bench"
    assert (
        arm.host_binary("gh200")
        == "target/cluster/gh200/precompiled-cu128-arm-aarch64/release/bench"
    )
    assert (
        by_hosts[("x1",)].host_binary("x1") == "target/cluster/x1/precompiled-cu128/release/bench"
    )


def test_per_host_cross_target_dir_carries_the_cpu_architecture() -> None:
    c = cluster(cross={"aarch64": {}})
    jobs = {job.hosts[0]: job for job in plan(c, BOTH, shared=False)}
    assert jobs["gh200"].target_dir == "target/cluster/gh200/precompiled-cu128-arm-aarch64"
    assert jobs["x1"].target_dir == "target/cluster/x1/precompiled-cu128"


def test_a_host_without_a_cross_setup_is_refused_when_planned() -> None:
    with pytest.raises(FdlError, match=r"controller\.cross has no entry"):
        plan(cluster(), BOTH)


def test_docker_cross_build_uses_its_image_target_and_linker() -> None:
    docker = {"image": "flodl-cuda:{cuda_tag}"}
    cross = {"aarch64": {"image": "flodl-cross-arm64:{cuda_tag}"}}
    c = cluster(docker, cross)
    assert isinstance(c.controller.docker, DockerSettings)
    arm = next(j for j in plan(c, BOTH) if j.build.cross)
    argv = shlex.split(docker_line(arm, c.controller, c.controller.docker, "r", None))
    assert "flodl-cross-arm64:12.8" in argv
    assert "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc" in argv
    assert "CXX_aarch64_unknown_linux_gnu=aarch64-linux-g++" not in argv
    assert "CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++" in argv
    assert argv[-8:-4] == ["--target", ARM, "--bin", "bench"]  # then cargo's progress bar


def test_native_and_compose_cross_builds() -> None:
    c = cluster(cross={"aarch64": {"linker": "/opt/gcc/bin/aarch64-gcc"}})
    arm = next(j for j in plan(c, BOTH) if j.build.cross)
    native = shlex.split(native_line(arm, c.controller).split(" && exec ")[1])
    assert "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=/opt/gcc/bin/aarch64-gcc" in native
    assert native[-8:-4] == ["--target", ARM, "--bin", "bench"]
    composed = cluster("cuda", {"aarch64": {"service": "cuda-arm64"}})
    assert isinstance(composed.controller.docker, ComposeService)
    arm = next(j for j in plan(composed, BOTH) if j.build.cross)
    line = compose_line(
        arm, composed.controller, composed.controller.docker, ["docker", "compose"], "r", (0, 0)
    )
    argv = shlex.split(line.split(" && exec ")[1])
    assert argv[-4] == "cuda-arm64"
    assert f"--target {ARM} --bin bench" in argv[-1]
    assert "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc" in argv[-1]


@pytest.mark.parametrize(
    ("cross", "fragment"),
    [
        ({"sparc64": {}}, "no default Rust target and linker are known for sparc64"),
        ({"aarch64": {"image": "x"}}, "controller.cross['aarch64'].image: only for"),
        ({"aarch64": {"target": "not a triple"}}, "must be a target triple"),
        ({"AArch64": {}}, "as 'uname -m' prints it"),
        ({"aarch64": {"linker": "-evil"}}, "must be one word"),
    ],
)
def test_cross_setups_are_checked_at_the_edge(cross: Any, fragment: str) -> None:
    with pytest.raises(FdlError) as caught:
        cluster(None, cross)
    assert fragment in str(caught.value)


def test_cpu_arch_pin_is_validated() -> None:
    with pytest.raises(FdlError, match=r"workers\[2\]\.cpu_arch"):
        cluster(cpu_arch="arm 64")
    assert cluster(cpu_arch="aarch64").workers[2].cpu_arch == "aarch64"


CONTROLLER = ControllerAbi("x86_64", (2, 36), frozenset({"aarch64"}))
REQUEST = ProbeRequest("/d", False, True)


def facts(machine: str | None) -> ProbeFacts:
    return ProbeFacts("ok", machine, "ldd (GNU libc) 2.36", True)


def test_the_abi_gate_lets_a_cross_built_architecture_through() -> None:
    assert judge("h", REQUEST, facts("aarch64"), CONTROLLER).status == "ok"
    refused = judge("h", REQUEST, facts("ppc64le"), CONTROLLER)
    assert refused.status == "error"
    assert "add 'cross: {ppc64le: {}}' under controller" in refused.errors[0]


def test_a_pin_answers_for_a_silent_uname_and_must_agree_with_a_loud_one() -> None:
    assert judge("h", REQUEST, facts(None), CONTROLLER, pinned="aarch64").status == "ok"
    wrong = judge("h", REQUEST, facts("x86_64"), CONTROLLER, pinned="aarch64")
    assert "cpu_arch pins aarch64, but 'uname -m' says x86_64" in wrong.errors[0]


X86_HEADER = "127 69 76 70 2 1 1 0 0 0 0 0 0 0 0 0 3 0 62 0"
ARM_HEADER = "127 69 76 70 2 1 1 0 0 0 0 0 0 0 0 0 3 0 183 0"


def test_elf_machine_from_the_header() -> None:
    assert elf_machine(X86_HEADER) == "x86_64"
    assert elf_machine(ARM_HEADER) == "aarch64"
    assert elf_machine("35 33 47 98") is None  # "#!/b": a script, not ELF
    assert elf_machine(X86_HEADER.replace(" 62 0", " 2 1")) == "ELF machine 258"


def test_a_binary_for_another_cpu_is_refused_naming_both() -> None:
    copy = RemoteCopy("aa", (), cpu_arch="aarch64", binary_cpu_arch="x86_64")
    problems = copy_problems("gh200", "/m/bin", copy, "aa", None)
    assert problems == [
        "gh200: /m/bin is a x86_64 binary but the host is aarch64: it cannot run there"
    ]


def test_two_cpus_cannot_share_one_arch_directory() -> None:
    """Every build links libtorch/<arch> on the controller: an x86_64 and an aarch64 host on
    'precompiled/cu128' would link the aarch64 build against the x86_64 library."""
    with pytest.raises(FdlError, match="give each CPU's variant a directory of its own"):
        plan(cluster(cross={"aarch64": {}}), {"gh200": "aarch64"})  # spark: x86_64


def test_a_cross_setup_may_replace_the_run_args_and_env() -> None:
    docker = {"image": "img", "run_args": ["--volume=/rust:/rust:ro"], "env": {"PATH": "/rust"}}
    cross = {"aarch64": {"image": "cross", "run_args": [], "env": {"CARGO_HOME": "/tmp/c"}}}
    c = cluster(docker, cross)
    assert isinstance(c.controller.docker, DockerSettings)
    jobs = {j.hosts: j for j in plan(c, BOTH)}
    arm = shlex.split(
        docker_line(jobs[("gh200", "spark")], c.controller, c.controller.docker, "r", None)
    )
    native = shlex.split(docker_line(jobs[("x1",)], c.controller, c.controller.docker, "r", None))
    assert "--volume=/rust:/rust:ro" in native and "PATH=/rust" in native
    assert "--volume=/rust:/rust:ro" not in arm and "PATH=/rust" not in arm
    assert "CARGO_HOME=/tmp/c" in arm


def test_file_machine_reads_the_header_of_a_file(tmp_path: Path) -> None:
    binary = tmp_path / "lib.so"
    binary.write_bytes(bytes(int(b) for b in ARM_HEADER.split()))
    assert file_machine(binary) == "aarch64"
    assert file_machine(tmp_path / "missing.so") is None
