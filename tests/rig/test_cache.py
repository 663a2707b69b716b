"""The compile cache on the rig: the real ``inv prebuild``, Docker and native cargo.

The project is :mod:`bench.flodl_crate` at its tiny size: torch-sys compiles
a C shim against the variant's ``include/torch_shim.h`` (``FDL_TORCH_ABI``) and
links the variant's stub ``libtorch.so``; the binary prints both. With
sccache, the second variant's build gets every library from the cache but
torch-sys when the headers differ (its static archive is hashed), torch-sys
too when they are equal; each host's binary still prints its own variant and
its own ABI. tch hits either way, rightly: cargo hands it torch-sys's
metadata (``--extern torch_sys=….rmeta``), which the C shim does not change,
and tch's rlib holds none of the shim's code; the final link (never cached)
takes the shim from torch-sys's own rlib.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import flodl_crate
from fdl_tasks.publish.envelope import PerHostEnvelope, decode
from rig.harness import RigCluster, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec("cache-a", "127.0.0.141"), HostSpec("cache-b", "127.0.0.142")]
CU128, CU126, CU118, SM = (
    "precompiled/cu128",
    "precompiled/cu126",
    "precompiled/cu118",
    "builds/sm61-sm120",
)
#: A source build named after every SM it targets: a long target dir name.
LONG = "builds/sm50-sm52-sm60-sm61-sm70-sm75-sm80-sm86-sm89-sm90"
#: Each variant's FDL_TORCH_ABI: cu128 and the source builds share a header byte for byte.
ABI = {CU128: 2071, CU126: 2082, CU118: 2053, SM: 2071, LONG: 2071}
SIZE = flodl_crate.TINY
#: Libraries per build that sccache may cache: the ordinary crates, torch-sys, tch.
CACHEABLE = flodl_crate.cacheable_crates(SIZE)
#: torch-sys: what misses when the headers differ.
VARIANT_CRATES = 1

Stats = dict[str, str]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("cache"), HOSTS, docker=True) as cluster:
        flodl_crate.generate(cluster.project, SIZE)
        flodl_crate.layout_variants(cluster.project, ABI)
        yield cluster


@pytest.fixture
def cache_dir(rig: RigCluster, tmp_path: Path) -> Path:
    """A cold start: no target dir, and a compile cache of the test's own."""
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    return tmp_path / "sccache"


@pytest.fixture(params=["docker", "native"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_prebuild(
    rig: RigCluster, archs: dict[str, str], mode: str, cache_dir: Path, *options: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``inv prebuild --json`` for those hosts, with the test's own compile cache."""
    workers = [rig.worker(host, arch=arch) for host, arch in archs.items()]
    controller = {"docker": rig.docker_settings()} if mode == "docker" else {}
    path = rig.write(workers, "cache.yaml", **controller)
    env["INVOKE_FDL_COMPILE_CACHE_DIR"] = str(cache_dir)
    return rig.inv(*prebuild_args(path, "--json", *options), env=env)


def prebuild(
    rig: RigCluster, archs: dict[str, str], mode: str, cache_dir: Path, *options: str
) -> tuple[dict[str, PerHostEnvelope], Stats]:
    """A successful prebuild: each host's envelope entry and the summary's ``cache`` column."""
    done = run_prebuild(rig, archs, mode, cache_dir, *options)
    assert done.returncode == 0, done.stderr
    return decode(done.stdout, "stdout"), cache_column(done.stderr, list(archs))


def cache_column(stderr: str, hosts: list[str]) -> Stats:
    """host → its ``cache`` cell in the summary table (cells are 2+ spaces apart)."""
    rows = [re.split(r" {2,}", line.strip()) for line in stderr.splitlines()]
    header = ["host", "arch", "build", "result", "seconds", "binary", "cache"]
    assert header in rows, stderr
    body = rows[rows.index(header) + 1 :]
    index = header.index("cache")
    column = {row[0]: row[index] for row in body if len(row) == len(header) and row[0] in hosts}
    assert sorted(column) == sorted(hosts), stderr
    return column


def hits(cell: str) -> tuple[int, int]:
    """``"3/5 hits"`` → (3, 5)."""
    match = re.fullmatch(r"(\d+)/(\d+) hits", cell)
    assert match, f"not a hit count: {cell!r}"
    return int(match.group(1)), int(match.group(2))


def assert_each_host_runs_its_own(
    rig: RigCluster, envelopes: dict[str, PerHostEnvelope], archs: dict[str, str]
) -> None:
    """Run on its host, each binary names its own libtorch and its own shim ABI."""
    for host, arch in archs.items():
        line = rig.run_on_host(host, str(rig.project), envelopes[host])
        assert line == flodl_crate.expected_line(arch, ABI[arch]), (host, arch)


def stats_files(rig: RigCluster) -> list[Path]:
    return sorted((rig.project / "target").rglob("sccache-stats.json"))


def test_different_headers_share_all_but_torch_sys(
    rig: RigCluster, mode: str, cache_dir: Path
) -> None:
    archs = {"cache-a": CU128, "cache-b": CU126}
    envelopes, column = prebuild(rig, archs, mode, cache_dir)
    assert_each_host_runs_its_own(rig, envelopes, archs)
    assert hits(column["cache-a"]) == (0, CACHEABLE)  # the first build runs alone, cold
    # torch-sys's archive differs: it misses; its metadata does not, so tch hits.
    assert hits(column["cache-b"]) == (CACHEABLE - VARIANT_CRATES, CACHEABLE)
    assert len(stats_files(rig)) == 2


def test_identical_headers_share_torch_sys_too(rig: RigCluster, mode: str, cache_dir: Path) -> None:
    archs = {"cache-a": CU128, "cache-b": SM}
    envelopes, column = prebuild(rig, archs, mode, cache_dir)
    assert hits(column["cache-a"]) == (0, CACHEABLE)
    assert hits(column["cache-b"]) == (CACHEABLE, CACHEABLE)
    # The same torch-sys rlib, yet each binary links (never cached) its own libtorch.so.
    assert_each_host_runs_its_own(rig, envelopes, archs)


def test_an_arch_swap_builds_the_new_variant_from_the_cache(
    rig: RigCluster, mode: str, cache_dir: Path
) -> None:
    prebuild(rig, {"cache-a": CU128, "cache-b": CU126}, mode, cache_dir)
    swapped = {"cache-a": CU128, "cache-b": CU118}
    envelopes, column = prebuild(rig, swapped, mode, cache_dir)
    assert_each_host_runs_its_own(rig, envelopes, swapped)
    assert column["cache-a"] == "-"  # up to date: no rustc ran, no server was started
    assert hits(column["cache-b"]) == (CACHEABLE - VARIANT_CRATES, CACHEABLE)


def test_an_edit_of_the_command_alone_starts_no_sccache_server(
    rig: RigCluster, mode: str, cache_dir: Path
) -> None:
    """Only the binary crate recompiles, and sccache never caches what links: it goes
    straight to rustc, so no server starts (no counts, ``-``), and each host runs the edit."""
    archs = {"cache-a": CU128, "cache-b": CU126}
    prebuild(rig, archs, mode, cache_dir)
    crate = rig.project / flodl_crate.COMMAND
    original = (crate / "src" / "main.rs").read_text()
    try:
        flodl_crate.edit_main(crate, "edit1")
        envelopes, column = prebuild(rig, archs, mode, cache_dir)
    finally:
        (crate / "src" / "main.rs").write_text(original)
    assert column == {"cache-a": "-", "cache-b": "-"}
    assert stats_files(rig) == []
    for host, arch in archs.items():
        line = rig.run_on_host(host, str(rig.project), envelopes[host])
        assert line == f"{flodl_crate.expected_line(arch, ABI[arch])} rev=edit1", (host, arch)


def test_no_cache_builds_the_same_binaries_without_sccache(
    rig: RigCluster, mode: str, cache_dir: Path
) -> None:
    archs = {"cache-a": CU128, "cache-b": CU118}
    envelopes, column = prebuild(rig, archs, mode, cache_dir, "--no-cache")
    assert_each_host_runs_its_own(rig, envelopes, archs)
    assert column == {"cache-a": "-", "cache-b": "-"}
    assert stats_files(rig) == []
    assert not cache_dir.exists()


def test_no_cache_over_a_cached_run_builds_the_same_binaries(
    rig: RigCluster, mode: str, cache_dir: Path
) -> None:
    """Same target dirs, first with the cache (Docker: at /fdl-target), then without."""
    archs = {"cache-a": CU128, "cache-b": CU126}
    _, cached = prebuild(rig, archs, mode, cache_dir)
    envelopes, column = prebuild(rig, archs, mode, cache_dir, "--no-cache")
    assert_each_host_runs_its_own(rig, envelopes, archs)
    assert cached != column  # the cached run's counts are not shown again
    assert column == {"cache-a": "-", "cache-b": "-"}


def sccache_servers(cache_dir: Path) -> list[int]:
    """Process ids of the sccache processes that use ``cache_dir`` (a test's own)."""
    wanted = f"SCCACHE_DIR={cache_dir}".encode()
    found = []
    for process in Path("/proc").glob("[0-9]*"):
        try:
            named = (process / "comm").read_text().strip() == "sccache"
            if named and wanted in (process / "environ").read_bytes().split(b"\0"):
                found.append(int(process.name))
        except (OSError, ValueError):
            continue
    return found


def test_a_timed_out_native_build_stops_at_its_timeout_and_leaves_no_server(
    rig: RigCluster, cache_dir: Path
) -> None:
    started = time.monotonic()
    try:
        done = run_prebuild(
            rig, {"cache-a": CU128}, "native", cache_dir, "--timeout", "4", FDL_TORCH_SYS_SLEEP="30"
        )
        seconds = time.monotonic() - started
        if done.returncode == 0 or "timed out after 4s" not in done.stderr:
            pytest.fail(f"the build did not time out:\n{done.stderr}")
        problems = [f"inv took {seconds:.0f} s"] if seconds > 20 else []
        servers = sccache_servers(cache_dir)
        if servers:
            problems.append(f"sccache server(s) left: {servers}")
        assert not problems, problems
    finally:
        for pid in sccache_servers(cache_dir):  # this test's own, found by its cache dir
            os.kill(pid, signal.SIGTERM)


def test_a_long_arch_builds_natively_with_the_cache(rig: RigCluster, cache_dir: Path) -> None:
    archs = {"cache-a": LONG}
    done = run_prebuild(rig, archs, "native", cache_dir)
    assert "path must be shorter than SUN_LEN" not in done.stderr
    if done.returncode != 0:
        pytest.fail(done.stderr)
    line = rig.run_on_host("cache-a", str(rig.project), decode(done.stdout, "stdout")["cache-a"])
    if line != flodl_crate.expected_line(LONG, ABI[LONG]):
        pytest.fail(line)
