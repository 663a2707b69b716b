"""NCCL version skew through the real ``inv``: hosts whose variants bring NCCL 2.21 and
2.26 get one warning naming both, or (``fdl.nccl_mismatch: error``) nothing is built.

Each variant's NCCL is an empty ``libnccl.so.X.Y.Z`` in its ``lib``, as precompiled
libtorch ships it; the probe reads it over each host's own sshd.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.harness import RigCluster, start_rig
from rig.project import add_nccl
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("node-a", "127.0.0.125"),
    HostSpec("node-b", "127.0.0.126"),
    HostSpec("node-c", "127.0.0.127"),
    HostSpec("cpu", "127.0.0.128"),
]
OLDER, NEWER, CPU = "precompiled/cu124", "precompiled/cu128", "precompiled/cpu"
WARNING = (
    "  warning  ctrl (controller, local): NCCL differs across hosts: 2.21 (node-a, node-b), "
    "2.26 (node-c): a DDP job across them hangs or fails at the first collective"
)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("nccl"), HOSTS, [OLDER, NEWER, CPU]) as cluster:
        add_nccl(cluster.project, OLDER, "2.21.5")
        add_nccl(cluster.project, NEWER, "2.26.2")
        yield cluster


def skewed(rig: RigCluster) -> Path:
    workers = [
        rig.worker("node-a", arch=OLDER),
        rig.worker("node-b", arch=OLDER),
        rig.worker("node-c", arch=NEWER),
        rig.worker("cpu", arch=CPU),
    ]
    return rig.write(workers, "skewed.yaml")


def test_hosts_on_nccl_2_21_and_2_26_get_one_warning_naming_both(rig: RigCluster) -> None:
    done = rig.inv("preflight", "--json", "--cluster-file", str(skewed(rig)))
    assert done.returncode == 0, done.stderr
    lines = [s for s in done.stderr.splitlines() if "NCCL" in s]
    assert len(lines) == 1 and lines[0].startswith(WARNING), done.stderr
    verdicts = {v["host"]: v for v in json.loads(done.stdout)}
    assert [verdicts[h]["nccl"] for h in ("node-a", "node-b", "node-c", "cpu")] == [
        "2.21.5",
        "2.21.5",
        "2.26.2",
        None,
    ]
    agreeing = rig.write([rig.worker("node-a", arch=OLDER), rig.worker("node-b", arch=OLDER)])
    quiet = rig.inv("preflight", "--cluster-file", str(agreeing))
    assert quiet.returncode == 0 and "NCCL" not in quiet.stderr, quiet.stderr


def test_the_setting_at_error_builds_nothing(rig: RigCluster) -> None:
    path = skewed(rig)
    strict = {"INVOKE_FDL_NCCL_MISMATCH": "error"}
    refused = rig.inv("preflight", "--cluster-file", str(path), env=strict)
    assert refused.returncode != 0
    assert WARNING.replace("  warning ", "  error   ") in refused.stderr, refused.stderr
    built = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env=strict)
    assert built.returncode != 0
    assert "error    ctrl (controller, local): NCCL differs across hosts" in built.stderr
    assert "nothing was built" in built.stderr and "Compiling" not in built.stderr
    assert not (rig.project / "target/cluster").exists()
