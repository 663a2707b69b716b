"""Distributed compiles on the rig: the real ``inv prebuild`` with ``controller.dist``.

A scheduler and a build server of sccache's own ``sccache-dist`` run on loopback
(:mod:`rig.dist`: token auth, bubblewrap sandboxes), the project is the flodl-shaped
crate of :mod:`bench.flodl_crate` (torch-sys compiles a C shim against the variant's
header), and the three hosts each get a variant of their own. What must hold:

- compiles go to the build server (the summary's ``dist N/M`` and sccache's own
  ``dist_compiles``), in every mode: native cargo, ``docker run``, docker compose;
- every binary, run on its host, prints its own variant and its own shim value, also
  after a variant's header changed;
- a unit the build server cannot compile (a static library named only in ``#[link]``,
  which sccache does not ship; a server whose sandbox cannot run the toolchain) is
  compiled locally and the build succeeds, saying which unit;
- the scheduler down: a warning and a correct local build, well inside the timeout;
  a refused token: an error before any build; the token never printed.

The toolchain archive sccache packs for the build server (~200 MB, ~40 s here) is a
once-per-machine cost: the tests share it (every test's ``<cache>-dist/toolchains``
is the module's), while each test starts from an empty cache and target tree.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import flodl_crate
from fdl_tasks.publish.envelope import PerHostEnvelope, decode
from rig.dist import DistRig, ServerSpec
from rig.harness import RigCluster, prebuild_args, rig_worker, start_rig, write_cluster
from rig.project import write_compose_file
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("dist-a", "127.0.0.161"),
    HostSpec("dist-b", "127.0.0.162"),
    HostSpec("dist-c", "127.0.0.163"),
]
CU128, CU126, CU118 = "precompiled/cu128", "precompiled/cu126", "precompiled/cu118"
ABI = {CU128: 2071, CU126: 2082, CU118: 2053}
ARCHS = {"dist-a": CU128, "dist-b": CU126, "dist-c": CU118}
SIZE = flodl_crate.TINY

Column = dict[str, str]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("dist"), HOSTS, docker=True) as cluster:
        flodl_crate.generate(cluster.project, SIZE)
        flodl_crate.layout_variants(cluster.project, ABI)
        write_compose_file(cluster.project)
        yield cluster


@pytest.fixture(scope="module")
def dist(rig: RigCluster) -> Iterator[DistRig]:
    farm = DistRig(rig.root / "dist-rig", [ServerSpec()], scheduler_port=0, tied=True)  # free ports
    try:
        yield farm.up()
    finally:
        farm.down()


@pytest.fixture(scope="module")
def toolchains(rig: RigCluster) -> Path:
    """The toolchain archives, shared by the module's tests (packed once per compiler path)."""
    path = rig.root / "toolchains"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def cache_dir(rig: RigCluster, tmp_path: Path, toolchains: Path) -> Path:
    """A cold start: no target dir, an empty compile cache; the toolchain archives kept."""
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    (tmp_path / "sccache-dist").mkdir(mode=0o700)
    (tmp_path / "sccache-dist" / "toolchains").symlink_to(toolchains)
    return tmp_path / "sccache"


def controller(rig: RigCluster, mode: str, farm: DistRig | None, **extra: Any) -> dict[str, Any]:
    """``controller`` of a cluster file in ``mode``: ``docker run`` builds share the host's
    network (the scheduler is on loopback), as does the rig's compose service ``cuda``."""
    fields: dict[str, Any] = {"path": str(rig.project), **extra}
    if farm is not None:
        fields["dist"] = farm.dist_settings()
    if mode == "docker":
        docker = rig.docker_settings()
        docker["run_args"] = [*docker["run_args"], "--network=host"]
        fields["docker"] = docker
    elif mode == "compose":
        fields["docker"] = "cuda"
    return fields


def run_prebuild(
    rig: RigCluster,
    cache_dir: Path,
    fields: dict[str, Any],
    archs: dict[str, str] = ARCHS,
    *options: str,
    project: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    project = project or rig.project
    workers = [rig_worker(rig.rig, host, project, arch=arch) for host, arch in archs.items()]
    path = write_cluster(rig.root / "dist.yaml", fields, workers)
    env = {"INVOKE_FDL_COMPILE_CACHE_DIR": str(cache_dir)}
    return rig.inv(*prebuild_args(path, "--json", *options), env=env, timeout=timeout)


def cache_column(stderr: str, hosts: list[str]) -> Column:
    """host → its ``cache`` cell in the summary table (cells are 2+ spaces apart)."""
    rows = [re.split(r" {2,}", line.strip()) for line in stderr.splitlines()]
    header = next((row for row in rows if row[:2] == ["host", "arch"] and "cache" in row), None)
    assert header is not None, stderr
    index = header.index("cache")
    body = rows[rows.index(header) + 1 :]
    column = {row[0]: row[index] for row in body if len(row) == len(header) and row[0] in hosts}
    assert sorted(column) == sorted(hosts), stderr
    return column


def remote(cell: str) -> tuple[int, int]:
    """``"4/5 hits, dist 1/1"`` → (1, 1)."""
    match = re.search(r"\bdist (\d+)/(\d+)", cell)
    assert match, f"no remote compile count in {cell!r}"
    return int(match.group(1)), int(match.group(2))


def sccache_remote_compiles(target: Path) -> int:
    """Remote compiles by sccache's own count, over every build of the tree."""
    total = 0
    for path in target.rglob("sccache-stats.json"):
        total += sum(json.loads(path.read_text())["stats"]["dist_compiles"].values())
    return total


def assert_each_host_runs_its_own(
    rig: RigCluster, stdout: str, archs: dict[str, str], abi: dict[str, int] = ABI
) -> None:
    envelopes: dict[str, PerHostEnvelope] = decode(stdout, "stdout")
    for host, arch in archs.items():
        line = rig.run_on_host(host, str(rig.project), envelopes[host])
        assert line == flodl_crate.expected_line(arch, abi[arch]), (host, arch)


@pytest.mark.parametrize("mode", ["native", "docker", "compose"])
def test_a_cold_prebuild_of_three_variants_compiles_remotely(
    rig: RigCluster, dist: DistRig, cache_dir: Path, mode: str
) -> None:
    done = run_prebuild(rig, cache_dir, controller(rig, mode, dist))
    assert done.returncode == 0, done.stderr
    assert f"distributed compiles through the sccache-dist scheduler at {dist.url}" in done.stderr
    column = cache_column(done.stderr, list(ARCHS))
    counts = {host: remote(cell) for host, cell in column.items()}
    # The first build compiles every library remotely; the others hit the cache for
    # all but torch-sys (its variant's header differs), which goes remote too.
    assert all(done_remotely > 0 for done_remotely, _ in counts.values()), column
    assert sccache_remote_compiles(rig.project / "target") == sum(n for n, _ in counts.values())
    assert_each_host_runs_its_own(rig, done.stdout, ARCHS)


def test_a_header_change_never_gets_a_stale_object(
    rig: RigCluster, dist: DistRig, cache_dir: Path
) -> None:
    archs = {"dist-a": CU128, "dist-b": CU126}
    first = run_prebuild(rig, cache_dir, controller(rig, "native", dist), archs)
    assert first.returncode == 0, first.stderr
    assert_each_host_runs_its_own(rig, first.stdout, archs)
    changed = {**ABI, CU126: 2099}
    flodl_crate.layout_variants(rig.project, {CU126: 2099})
    try:
        again = run_prebuild(rig, cache_dir, controller(rig, "native", dist), archs)
        assert again.returncode == 0, again.stderr
        assert_each_host_runs_its_own(rig, again.stdout, archs, changed)
        assert remote(cache_column(again.stderr, ["dist-b"])["dist-b"])[0] >= 1  # torch-sys
    finally:
        flodl_crate.layout_variants(rig.project, {CU126: ABI[CU126]})


# ------------------------------------------------------------------ remote failures

#: A crate that links a static library its build script makes, named only in
#: ``#[link]`` and found through ``rustc-link-search``: sccache neither hashes nor
#: ships it, so its remote compile fails ("could not find native static library").
BLIND_BUILD_RS = r"""use std::{env, path::PathBuf, process::Command};
fn main() {
    let root = PathBuf::from(env::var_os("LIBTORCH_PATH").expect("LIBTORCH_PATH"));
    let include = root.join("include");
    println!("cargo:rerun-if-env-changed=LIBTORCH_PATH");
    println!("cargo:rerun-if-changed={}", include.join("torch_shim.h").display());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let source = out.join("blind.c");
    let code = "#include <torch_shim.h>\nint blind_abi(void) { return FDL_TORCH_ABI; }\n";
    std::fs::write(&source, code).unwrap();
    let object = out.join("blind.o");
    let status = Command::new("cc").args(["-c", "-fPIC", "-I"]).arg(&include).arg(&source)
        .arg("-o").arg(&object).status().unwrap();
    assert!(status.success());
    let _ = std::fs::remove_file(out.join("libblindshim.a"));
    assert!(Command::new("ar").arg("crs").arg(out.join("libblindshim.a")).arg(&object)
        .status().unwrap().success());
    println!("cargo:rustc-link-search=native={}", out.display());
}
"""
BLIND_LIB = """#[link(name = "blindshim", kind = "static")]
extern "C" { fn blind_abi() -> i32; }
pub fn abi() -> i32 { unsafe { blind_abi() } }
"""
BLIND_MAIN = """fn main() {
    let cuda = if cfg!(feature = "cuda") { "on" } else { "off" };
    let variant = std::env::var("FDL_VARIANT").unwrap_or_default();
    println!("ddp-bench variant={variant} shim={} cuda={cuda}", blind::abi());
}
"""


def blind_project(root: Path) -> Path:
    """A workspace: the ``blind`` crate and a ``ddp-bench`` binary printing its value."""
    files = {
        "Cargo.toml": '[workspace]\nmembers = ["blind", "ddp-bench"]\nresolver = "2"\n',
        "Cargo.lock": (
            "version = 4\n\n"
            '[[package]]\nname = "blind"\nversion = "0.1.0"\n\n'
            '[[package]]\nname = "ddp-bench"\nversion = "0.1.0"\ndependencies = [\n "blind",\n]\n'
        ),
        "blind/Cargo.toml": (
            '[package]\nname = "blind"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n'
        ),
        "blind/build.rs": BLIND_BUILD_RS,
        "blind/src/lib.rs": BLIND_LIB,
        "ddp-bench/Cargo.toml": (
            '[package]\nname = "ddp-bench"\nversion = "0.1.0"\nedition = "2021"\n\n'
            '[dependencies]\nblind = { path = "../blind" }\n\n'
            "[features]\ndefault = []\ncuda = []\n"
        ),
        "ddp-bench/src/main.rs": BLIND_MAIN,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    flodl_crate.layout_variants(root, ABI)
    return root


def run_blind(rig: RigCluster, host: str, project: Path, entry: PerHostEnvelope, arch: str) -> str:
    command = (
        f"cd {project}/{entry.cwd_subpath} && FDL_VARIANT={arch} "
        f"LD_LIBRARY_PATH={entry.ld_library_path} {project}/{entry.bin}"
    )
    done = subprocess.run(
        rig.rig.ssh_argv(host, command), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[0]


@pytest.mark.parametrize("mode", ["native", "docker"])
def test_a_static_library_the_server_is_not_sent_is_compiled_locally(
    rig: RigCluster, dist: DistRig, cache_dir: Path, mode: str
) -> None:
    project = blind_project(rig.root / "blind")
    shutil.rmtree(project / "target", ignore_errors=True)
    archs = {"dist-a": CU128, "dist-b": CU126}
    fields = {**controller(rig, mode, dist), "path": str(project)}
    done = run_prebuild(rig, cache_dir, fields, archs, project=project)
    assert done.returncode == 0, done.stderr
    column = cache_column(done.stderr, list(archs))
    # Each variant's blind crate fails remotely, then compiles locally, never cached:
    # so never a stale object either (sccache does not hash that library).
    assert all("compiled locally after a failure: blind" in cell for cell in column.values())
    assert "fdl-tasks: blind: compiling through sccache failed" in done.stderr
    envelopes = decode(done.stdout, "stdout")
    for host, arch in archs.items():
        line = run_blind(rig, host, project, envelopes[host], arch)
        assert line == flodl_crate.expected_line(arch, ABI[arch]), (host, arch)


def test_a_server_that_cannot_run_the_toolchain_leaves_compiles_local(
    rig: RigCluster, cache_dir: Path
) -> None:
    broken = DistRig(
        rig.root / "broken-rig", [ServerSpec(broken=True)], scheduler_port=0, tied=True
    )
    try:
        broken.up()
        done = run_prebuild(rig, cache_dir, controller(rig, "native", broken))
        assert done.returncode == 0, done.stderr
        column = cache_column(done.stderr, list(ARCHS))
        # sccache's own fallback: the job fails on the server, the unit compiles here.
        assert all(remote(cell)[0] == 0 for cell in column.values()), column
        assert all("failed remotely, compiled here" in cell for cell in column.values()), column
        assert_each_host_runs_its_own(rig, done.stdout, ARCHS)
    finally:
        broken.down()


# ------------------------------------------------------------------ the scheduler, the token


def test_a_container_off_the_hosts_network_builds_locally_and_says_so(
    rig: RigCluster, dist: DistRig, cache_dir: Path
) -> None:
    fields = controller(rig, "docker", dist)
    fields["docker"]["run_args"] = [*rig.docker_settings()["run_args"], "--network=bridge"]
    archs = {"dist-a": CU128}
    done = run_prebuild(rig, cache_dir, fields, archs)
    assert done.returncode == 0, done.stderr
    cell = cache_column(done.stderr, ["dist-a"])["dist-a"]
    assert re.search(r"dist 0/\d+ \(scheduler unreachable from the build\)", cell), cell
    assert_each_host_runs_its_own(rig, done.stdout, archs)


def test_the_token_is_never_printed_and_a_refused_one_stops_before_any_build(
    rig: RigCluster, dist: DistRig, cache_dir: Path
) -> None:
    token = dist.token_file.read_text().strip()
    archs = {"dist-a": CU128}
    dry = run_prebuild(rig, cache_dir, controller(rig, "docker", dist), archs, "--dry")
    assert dry.returncode == 0, dry.stderr
    assert "SCCACHE_CONF=/opt/fdl-sccache-dist/client.toml" in dry.stderr
    done = run_prebuild(rig, cache_dir, controller(rig, "native", dist), archs)
    assert done.returncode == 0, done.stderr
    # Nothing prebuild writes under target/ (logs, envelopes, counts) holds it either.
    written = [
        path.read_text(errors="replace")
        for path in (rig.project / "target").rglob("*")
        if path.suffix in (".log", ".json", ".txt") and path.is_file()
    ]
    assert any("ddp-bench" in text for text in written)  # the envelope is among them
    for text in (dry.stdout, dry.stderr, done.stdout, done.stderr, *written):
        assert token not in text
    wrong = rig.root / "wrong.token"
    wrong.write_text("not-the-client-token\n")
    wrong.chmod(0o600)
    fields = controller(rig, "native", dist)
    fields["dist"] = {**fields["dist"], "token_file": str(wrong)}
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    refused = run_prebuild(rig, cache_dir, fields, archs)
    assert refused.returncode == 1
    assert f"the sccache-dist scheduler at {dist.url} refused the client token" in refused.stderr
    assert "not-the-client-token" not in refused.stderr
    assert not list((rig.project / "target").rglob("build.log"))  # no build started


def test_with_the_scheduler_down_the_build_is_local_and_correct(
    rig: RigCluster, dist: DistRig, cache_dir: Path
) -> None:
    dist.stop_scheduler()
    try:
        started = time.monotonic()
        done = run_prebuild(rig, cache_dir, controller(rig, "native", dist), timeout=300)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert f"warning: the sccache-dist scheduler at {dist.url} does not answer" in done.stderr
        column = cache_column(done.stderr, list(ARCHS))
        assert not any("dist" in cell for cell in column.values()), column
        assert_each_host_runs_its_own(rig, done.stdout, ARCHS)
        assert seconds < 120, f"{seconds:.0f} s"
    finally:
        dist.start_scheduler()
        dist.wait_for(lambda status: bool(status and status[0] >= 1), "the server", 60)
