"""An aarch64 host among x86_64 ones, end to end through the real ``inv`` (issue #13).

``gh200`` is an emulated aarch64 host (``HostSpec(emulate="aarch64")``): its
``uname -m`` says aarch64, its programs run under qemu-user through binfmt,
and its ``ldd`` traces aarch64 files with the aarch64 loader. Its libtorch
variant is an aarch64 stub in a directory of its own
(``precompiled/cu128-aarch64``: the controller links each build against
``<controller.path>/libtorch/<arch>``), built in the rig's cross image
(:mod:`rig.cross`), which also cross-builds the binary. So the binary that
prebuild verifies and launch runs there is a real aarch64 program.

Native cargo mode needs a controller toolchain with an aarch64 std.  rustup's
toolchain here has none (``rustup target add`` needs the network), so
:func:`test_native_cross_build` uses the first of the rustc on ``PATH`` and
Debian's ``rustc-web`` (``/usr/bin``, with ``libstd-rust-web-dev:arm64``, both
installed by ``scripts/setup``) that has one, put first on ``PATH`` for that
``inv`` run as a controller whose cargo is Debian's would have it.  It skips,
saying why, only where neither has one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from fdl_tasks.cargo.cross_targets import GNU_TARGETS
from fdl_tasks.core.binary_files import file_machine
from fdl_tasks.publish.envelope import PerHostEnvelope, decode
from rig.cross import CROSS_REF, add_aarch64_variant, ensure
from rig.harness import RigCluster, prebuild_args, start_rig
from rig.project import CROSS_SERVICE, write_compose_file
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("gb-1", "127.0.0.100"),
    HostSpec("gb-2", "127.0.0.101"),
    HostSpec("pascal", "127.0.0.102"),
    HostSpec("gh200", "127.0.0.103", emulate="aarch64"),
]
ARM_ARCH = "precompiled/cu128-aarch64"
ARCHS = {
    "gb-1": "precompiled/cu128",
    "gb-2": "precompiled/cu128",  # shares gb-1's build
    "pascal": "builds/sm61-sm120",
    "gh200": ARM_ARCH,  # its own build, cross-compiled
}
X86_VARIANTS = ["precompiled/cu128", "builds/sm61-sm120", "precompiled/cpu"]
FAST_RETRY = {"INVOKE_FDL_VERIFY_RETRIES": "1", "INVOKE_FDL_VERIFY_RETRY_DELAY": "0.2"}
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    ensure()  # qemu binfmt and the cross image (only checks when scripts/setup did it)
    tmp = tmp_path_factory.mktemp("aarch64")
    with start_rig(tmp, HOSTS, X86_VARIANTS, docker=True) as cluster:
        add_aarch64_variant(cluster.project, ARM_ARCH)
        write_compose_file(cluster.project, cross=True)
        yield cluster


def cluster_file(
    rig: RigCluster,
    name: str,
    docker: Any,
    cross: dict[str, str],
    *,
    pin: bool = False,
    arm_path: Path | None = None,
) -> Path:
    """Every host on its variant; ``gh200`` pinned to aarch64 or found by preflight."""
    workers = []
    for host, arch in ARCHS.items():
        fields: dict[str, Any] = {"arch": arch}
        if host == "gh200" and pin:
            fields["cpu_arch"] = "aarch64"
        if host == "gh200" and arm_path is not None:
            fields["path"] = str(arm_path)
        workers.append(rig.worker(host, **fields))
    controller: dict[str, Any] = {"cross": {"aarch64": cross}}
    if docker is not None:
        controller["docker"] = docker
    return rig.write(workers, name, **controller)


def docker_run_cluster(rig: RigCluster, name: str = "docker-run.yaml", **kw: Any) -> Path:
    return cluster_file(rig, name, rig.docker_settings(), {"image": CROSS_REF}, **kw)


def envelopes(rig: RigCluster) -> dict[str, PerHostEnvelope]:
    return decode((rig.project / ENVELOPE).read_text(), ENVELOPE)


def assert_cross_prebuild_and_launch(
    rig: RigCluster, path: Path, tool: str, env: dict[str, str] | None = None
) -> None:
    """One prebuild, three builds for four hosts, all verified; launch runs every variant."""
    done = rig.inv(*prebuild_args(path), env=env)
    assert done.returncode == 0, done.stderr
    assert f"prebuild: 3 build(s) with {tool}," in done.stderr
    assert f"{ARM_ARCH} (aarch64)" in done.stderr  # the summary names the cross build
    assert "verify: 4 host(s) verified (same bytes, every library resolves)\n" in done.stderr
    entries = envelopes(rig)
    assert entries["gh200"].bin.endswith("-aarch64-aarch64/release/ddp-bench")
    assert file_machine(rig.project / entries["gh200"].bin) == "aarch64"
    assert file_machine(rig.project / entries["gb-1"].bin) == "x86_64"
    launched = rig.inv("launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert launched.returncode == 0, launched.stderr
    for host, arch in ARCHS.items():
        assert f"[{host}] ddp-bench variant={arch} cuda=on" in launched.stdout


def test_docker_run_cross_builds_the_aarch64_host_and_launches_it(rig: RigCluster) -> None:
    """gh200 is found by preflight (``uname -m``), not pinned."""
    assert_cross_prebuild_and_launch(rig, docker_run_cluster(rig), "docker run")


def test_compose_cross_service_builds_the_aarch64_host(rig: RigCluster) -> None:
    """flodl's form: ``controller.docker: cuda``, the cross build in ``cuda-arm64``."""
    path = cluster_file(rig, "compose.yaml", "cuda", {"service": CROSS_SERVICE}, pin=True)
    assert_cross_prebuild_and_launch(rig, path, "docker compose run")


def host_view(rig: RigCluster, name: str) -> Path:
    """A host-private copy of the project (libtorch included, no builds): a stale mount."""
    view = rig.root / f"view-{name}"
    shutil.rmtree(view, ignore_errors=True)
    shutil.copytree(rig.project, view, ignore=shutil.ignore_patterns("target"), symlinks=True)
    return view


def built(rig: RigCluster) -> dict[str, PerHostEnvelope]:
    """Every host's binary built and verified in the shared project; the envelopes."""
    done = rig.inv(*prebuild_args(docker_run_cluster(rig)))
    assert done.returncode == 0, done.stderr
    return envelopes(rig)


def test_the_aarch64_binary_runs_on_the_emulated_host_with_its_libtorch_only(
    rig: RigCluster,
) -> None:
    entry = built(rig)["gh200"]
    line = rig.run_on_host("gh200", str(rig.project), entry)  # as the launcher runs it
    assert line == f"ddp-bench variant={ARM_ARCH} cuda=on"
    binary = rig.project / entry.bin
    bare = subprocess.run(
        rig.rig.ssh_argv("gh200", f"uname -m; ldd {binary}; {binary}"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bare.returncode == 127  # no LD_LIBRARY_PATH: the loader finds no libtorch.so
    assert "libtorch.so: cannot open shared object file" in bare.stderr
    lines = bare.stdout.splitlines()
    assert lines[0] == "aarch64"
    assert "libtorch.so => not found" in lines[1]  # the emulated host's ldd reads aarch64
    assert any("ld-linux-aarch64.so.1" in text for text in lines)


def test_an_emulated_host_is_a_whole_machine() -> None:
    with pytest.raises(ValueError, match="cannot be combined with uname_m"):
        HostSpec("odd", "127.0.0.104", emulate="aarch64", glibc_version="2.17")


def prebuild_with_arm_copy(rig: RigCluster, name: str, content: bytes) -> tuple[Path, str]:
    """gh200 sees its own copy of the tree, holding ``content`` as its binary: stderr."""
    entry = built(rig)["gh200"]
    view = host_view(rig, name)
    copy = view / entry.bin
    copy.parent.mkdir(parents=True)
    copy.write_bytes(content)
    copy.chmod(0o755)
    path = docker_run_cluster(rig, f"{name}.yaml", arm_path=view)
    done = rig.inv(*prebuild_args(path), env=FAST_RETRY)
    assert done.returncode == 1, done.stderr
    assert "delivery verification failed; no envelope was published" in done.stderr
    assert not (rig.project / ENVELOPE).exists()
    return copy, done.stderr


def test_stale_aarch64_copy_is_caught(rig: RigCluster) -> None:
    """An older build's bytes (this one with more bytes after it: still aarch64 ELF)."""
    current = (rig.project / built(rig)["gh200"].bin).read_bytes()
    copy, stderr = prebuild_with_arm_copy(rig, "stale", current + b"\0older build")
    assert f"gh200: {copy} differs from the controller's build" in stderr
    assert "stale or lagging shared mount" in stderr
    assert "binary but the host is" not in stderr  # right CPU, wrong bytes
    for host in ("gb-1", "gb-2", "pascal"):
        assert f"{host}:" not in stderr.split("verification failed")[1]


def test_x86_binary_where_the_aarch64_host_expects_its_own_is_refused(rig: RigCluster) -> None:
    x86 = (rig.project / built(rig)["gb-1"].bin).read_bytes()
    copy, stderr = prebuild_with_arm_copy(rig, "wrong-cpu", x86)
    assert f"gh200: {copy} is a x86_64 binary but the host is aarch64: it cannot run there" in (
        stderr
    )
    assert f"gh200: {copy} differs from the controller's build" in stderr


#: Debian's own toolchain (``rustc-web``, ``cargo-web``), which ``libstd-rust-web-dev:arm64``
#: gives an aarch64 std; tried after the rustc on ``PATH``.
DEBIAN_RUST_BIN = Path("/usr/bin")
RUST_TOOLS = ("cargo", "rustc", "rustdoc")


def aarch64_std_problem(rustc: str) -> str | None:
    """Why ``rustc`` cannot build for aarch64 (``None``: its sysroot has an aarch64 std)."""
    target, _ = GNU_TARGETS["aarch64"]
    try:
        answer = subprocess.run(
            [rustc, "--print", "target-libdir", "--target", target],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except OSError as exc:
        return f"{rustc}: {exc.strerror}"
    libdir = Path(answer.stdout.strip())
    if answer.returncode != 0 or not any(libdir.glob("libstd-*")):
        return f"{rustc} has no {target} std"
    return None


def native_cross_toolchain(bin_dir: Path) -> tuple[dict[str, str], str | None]:
    """The ``inv`` environment for a native aarch64 cross build, and why there is none.

    ``({}, None)`` when the controller's own ``rustc`` on ``PATH`` can do it.
    Otherwise Debian's ``/usr/bin`` toolchain, if it has an aarch64 std: ``bin_dir``
    gets ``cargo``, ``rustc`` and ``rustdoc`` that exec Debian's, and goes first on
    ``PATH`` (``/usr/bin`` itself first would shadow everything else too).
    """
    _, linker = GNU_TARGETS["aarch64"]
    if shutil.which(linker) is None:
        return {}, f"no {linker} on PATH (apt-get install gcc-aarch64-linux-gnu)"
    on_path = shutil.which("rustc")
    problems = []
    if on_path is not None:
        problem = aarch64_std_problem(on_path)
        if problem is None:
            return {}, None
        problems.append(problem)
    debian = DEBIAN_RUST_BIN / "rustc"
    if not (DEBIAN_RUST_BIN / "cargo").is_file() or not debian.is_file():
        problems.append(f"no Debian toolchain in {DEBIAN_RUST_BIN} (apt-get install cargo-web)")
        return {}, "; ".join(problems)
    problem = aarch64_std_problem(str(debian))
    if problem is not None:
        problems.append(f"{problem} (apt-get install libstd-rust-web-dev:arm64)")
        return {}, "; ".join(problems)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in RUST_TOOLS:  # not symlinks: rustc finds its sysroot from the path it ran as
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec {DEBIAN_RUST_BIN / tool} "$@"\n')
        wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}, None


def test_native_cross_build(rig: RigCluster) -> None:
    env, problem = native_cross_toolchain(rig.root / "debian-rust-bin")
    if problem is not None:
        pytest.skip(f"native cross build not possible here: {problem}")
    path = cluster_file(rig, "native.yaml", None, {})
    assert_cross_prebuild_and_launch(rig, path, "native cargo", env)
    # Built by the toolchain chosen above: rustc records its version in ``.comment``.
    rustc = subprocess.run(
        ["rustc", "--version"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    binary = rig.project / envelopes(rig)["gh200"].bin
    assert f"rustc version {rustc} ".encode() in elf_comment(binary)


def elf_comment(binary: Path) -> bytes:
    """The ELF file's ``.comment`` section (compilers' version strings)."""
    with binary.open("rb") as stream:
        section = ELFFile(stream).get_section_by_name(".comment")
        return b"" if section is None else section.data()


@pytest.mark.parametrize("tool", ["docker run", "docker compose run"])
def test_a_save_in_the_same_second_reaches_every_host_cross_builds_too(
    rig: RigCluster, tool: str
) -> None:
    """main.rs saved again with its mtime the built one plus 1 µs (a mount keeping whole
    seconds): cargo's mtime rule calls every build fresh, the build records do not; the
    aarch64 host's cross build and the compose builds included."""
    if tool == "docker run":
        path = docker_run_cluster(rig, "fresh-run.yaml")
    else:
        path = cluster_file(rig, "fresh-compose.yaml", "cuda", {"service": CROSS_SERVICE}, pin=True)
    main = rig.project / "ddp-bench/src/main.rs"
    original = main.read_text()
    launch = ("launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    try:
        for rev in ("a", "b"):
            mtime = main.stat().st_mtime_ns
            main.write_text(original.replace('cuda={cuda}");', f'cuda={{cuda}} rev={rev}");'))
            if rev == "b":
                os.utime(main, ns=(mtime + 1_000, mtime + 1_000))
            done = rig.inv(*prebuild_args(path))
            assert done.returncode == 0, done.stderr
            launched = rig.inv(*launch)
            assert launched.returncode == 0, launched.stderr
            for host, arch in ARCHS.items():
                line = f"[{host}] ddp-bench variant={arch} cuda=on rev={rev}"
                assert line in launched.stdout, launched.stdout + done.stderr
    finally:
        main.write_text(original)
