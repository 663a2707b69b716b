"""``inv prebuild --watch`` with an aarch64 host whose ``cpu_arch`` is not written:
every cycle cross-builds it, not only the cycles that run preflight (issue #31).

``wa-arm`` is an emulated aarch64 host (``HostSpec(emulate="aarch64")``: ``uname -m``
says aarch64, its programs run under qemu-user through binfmt, see
:mod:`tests.rig.test_aarch64`); ``wa-x86`` is an ordinary one. Real sshd, real
docker (the rig's cross image, or its compose service, builds the aarch64 binary) or
native cargo with an aarch64 std (found as :mod:`tests.rig.test_aarch64` finds it); each
published binary is run on its host over that host's sshd.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.config.layout import envelope_file
from fdl_tasks.core.binary_files import file_machine
from fdl_tasks.publish.envelope import decode
from rig.cross import CROSS_REF, add_aarch64_variant, ensure
from rig.harness import RigCluster, start_rig
from rig.project import CROSS_SERVICE, write_compose_file
from rig.sshrig import HostSpec
from tests.rig.test_aarch64 import native_cross_toolchain
from tests.rig.test_watch import (
    ENV,
    pristine_source,  # noqa: F401 (autouse: rev 0 per test)
    set_rev,
    wait_cycle,
)

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec("wa-x86", "127.0.6.20"), HostSpec("wa-arm", "127.0.6.21", emulate="aarch64")]
ARM_ARCH = "precompiled/cu128-aarch64"
ARCHS = {"wa-x86": "precompiled/cpu", "wa-arm": ARM_ARCH}
MACHINES = {"wa-x86": "x86_64", "wa-arm": "aarch64"}
ENVELOPE = envelope_file("ddp-bench")
#: Seconds one cycle may take: two builds (one under the cross image) on a shared machine.
CYCLE_BUDGET = 300


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    ensure()  # qemu binfmt and the cross image (only checks when scripts/setup did it)
    tmp = tmp_path_factory.mktemp("watch-aarch64")
    with start_rig(tmp, HOSTS, ["precompiled/cpu"], docker=True) as cluster:
        add_aarch64_variant(cluster.project, ARM_ARCH)
        write_compose_file(cluster.project, cross=True)
        yield cluster


def unpinned_cluster(rig: RigCluster, mode: str) -> Path:
    """``docker run`` with the cross image, compose with its cross service (flodl's
    form), or native cargo; no worker says its ``cpu_arch``."""
    workers = [rig.worker(host, arch=arch) for host, arch in ARCHS.items()]
    if mode == "native":
        controller: dict[str, Any] = {"cross": {"aarch64": {}}}
    elif mode == "compose":
        controller = {"docker": "cuda", "cross": {"aarch64": {"service": CROSS_SERVICE}}}
    else:
        controller = {"docker": rig.docker_settings(), "cross": {"aarch64": {"image": CROSS_REF}}}
    return rig.write(workers, f"unpinned-{mode}.yaml", **controller)


def published(rig: RigCluster) -> dict[str, tuple[str | None, str]]:
    """Each host's published binary: its ELF machine, and the rev it prints on its host."""
    entries = decode((rig.project / ENVELOPE).read_text(), "envelope")
    return {
        host: (
            file_machine(rig.project / entry.bin),
            rig.run_on_host(host, str(rig.project), entry).rsplit("rev=", 1)[-1],
        )
        for host, entry in entries.items()
    }


@pytest.mark.parametrize("mode", ["docker-run", "compose", "native"])
def test_every_cycle_cross_builds_the_unpinned_aarch64_host(rig: RigCluster, mode: str) -> None:
    env = dict(ENV)
    if mode == "native":  # a controller toolchain with an aarch64 std, as test_aarch64 finds it
        toolchain, problem = native_cross_toolchain(rig.root / "debian-rust-bin")
        if problem is not None:
            pytest.skip(f"native cross build not possible here: {problem}")
        env |= toolchain
    run = rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--watch",
        "--cluster-file",
        str(unpinned_cluster(rig, mode)),
        env=env,
    )
    state, _ = wait_cycle(run, 1, CYCLE_BUDGET)
    assert state == "ok", run.stderr
    assert published(rig) == {h: (MACHINES[h], "0") for h in ARCHS}
    for cycle, rev in ((2, "1"), (3, "2"), (4, "3")):
        set_rev(rig, rev)
        state, _ = wait_cycle(run, cycle, CYCLE_BUDGET)
        assert state == "ok", run.stderr
        assert published(rig) == {h: (MACHINES[h], rev) for h in ARCHS}, run.stderr
    # From the first preflight's facts: no cycle after it probed again.
    lines = [text for _, text in run.lines if text.startswith("watch: cycle ")]
    assert len(lines) == 4 and not any("preflight ok" in text for text in lines), lines


def test_build_host_probes_the_unpinned_aarch64_host(rig: RigCluster) -> None:
    """``build-host`` probes its one host as prebuild probes them all: the aarch64 host's
    ``uname -m`` makes its build a cross build, and the other host's entry is kept."""
    path = unpinned_cluster(rig, "docker-run")
    first = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert first.returncode == 0, first.stderr
    set_rev(rig, "7")
    done = rig.inv(
        "build-host", "--host", "wa-arm", "--cmd", "ddp-bench", "--cluster-file", str(path)
    )
    assert done.returncode == 0, done.stderr
    assert "preflight: probing 1 remote host(s)" in done.stderr
    assert "\npreflight: 2 ok, 0 with warnings, 0 with errors\n" in done.stderr
    assert published(rig) == {"wa-x86": ("x86_64", "0"), "wa-arm": ("aarch64", "7")}
