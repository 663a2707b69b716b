"""A no-op on a realistic workspace rebuilds nothing and starts no container, for real.

The project is :mod:`bench.flodl_crate` with 30 generated path crates and the
vendored third-party crates (serde, serde_json, regex and what they pull in, as
Debian packages them): 40+ crates, build scripts among them (torch-sys compiles
a C shim against the variant's header). The build stamps before build records
started a container on every no-op of such a workspace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from bench import flodl_crate
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec
from tests.rig.test_everyday import containers_run, docker_calls

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec("ws-a", "127.0.0.155")]
ARCH = "precompiled/cu128"
ABI = {ARCH: 2071}
SIZE = flodl_crate.Size(deps=30, modules=1, funcs=1, kinds=1, third_party=True)
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
HOUR = 3600 * 1_000_000_000


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    if not flodl_crate.DEBIAN_REGISTRY.is_dir():
        pytest.skip(f"the vendored crates come from {flodl_crate.DEBIAN_REGISTRY} (scripts/setup)")
    with start_rig(tmp_path_factory.mktemp("fresh-ws"), HOSTS, docker=True) as cluster:
        flodl_crate.generate(cluster.project, SIZE)
        flodl_crate.layout_variants(cluster.project, ABI)
        yield cluster


def prebuild(rig: RigCluster, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    docker = {"docker": rig.docker_settings()} if mode == "docker" else {}
    path = rig.write([rig.worker("ws-a", arch=ARCH)], f"{mode}.yaml", **docker)
    done = rig.inv(
        "prebuild", "--cmd", flodl_crate.COMMAND, "--cluster-file", str(path), env={**ENV, **env}
    )
    assert done.returncode == 0, done.stderr
    return done


def printed(rig: RigCluster) -> str:
    envelope = rig.project / f"target/cluster/_envelopes/{flodl_crate.COMMAND}.json"
    entry = decode(envelope.read_text(), str(envelope))["ws-a"]
    return rig.run_on_host("ws-a", str(rig.project), entry)


@pytest.mark.parametrize("mode", ["docker", "native"])
def test_a_no_op_rebuilds_nothing_and_an_old_mtime_edit_is_rebuilt(
    rig: RigCluster, mode: str
) -> None:
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    flodl_crate.edit_main(rig.project / flodl_crate.COMMAND, "a")
    crates = len(list(rig.project.glob("*/Cargo.toml"))) + len(
        list(rig.project.glob("*/*/Cargo.toml"))
    )
    assert crates >= 40
    # Native: the same environment (a build script may read any variable).
    shim, calls = docker_calls(rig, f"ws-{mode}") if mode == "docker" else ({}, None)
    prebuild(rig, mode, **shim)
    if calls is not None:
        calls.write_text("")  # the no-op's calls alone
    noop = prebuild(rig, mode, **shim)
    assert "Compiling" not in noop.stderr, noop.stderr
    if calls is not None:
        assert containers_run(calls) == 0, calls.read_text()
    assert "ok (unchanged since its last build: cargo not started)" in noop.stderr

    main = rig.project / flodl_crate.COMMAND / "src/main.rs"
    mtime = main.stat().st_mtime_ns
    flodl_crate.edit_main(rig.project / flodl_crate.COMMAND, "b")
    os.utime(main, ns=(mtime - HOUR, mtime - HOUR))
    edited = prebuild(rig, mode, **shim)
    assert printed(rig).endswith("rev=b"), edited.stderr
    assert f"Compiling {flodl_crate.COMMAND}" in edited.stderr
    assert "Compiling dep0 " not in edited.stderr  # the units that read nothing changed stay
