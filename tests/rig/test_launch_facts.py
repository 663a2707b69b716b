"""Launch facts through the real ``inv``, before any build: a loopback ``controller.host``
while a worker is elsewhere, ``local_devices: all`` on a host without a GPU, a variant
that needs a newer glibc than the host has.

"Elsewhere" without leaving loopback: the worker's ssh target is the TEST-NET address
192.0.2.10, and its ``HostName=`` option sends ssh to its sshd on loopback (Fabric
connects to ssh_config's ``HostName``). Run in a private network namespace, where
nothing but loopback exists, the probe answering proves no packet went to 192.0.2.10.
The newer glibc is a real ELF need (rig/newer_glibc.py) that real ``ldd`` reports.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.verification import copy_problems, parse_verification, verification_script
from rig.harness import RigCluster, inv_argv, start_rig
from rig.newer_glibc import NEWER, add_newer_glibc_variant
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("far", "127.0.0.243"),
    HostSpec("nogpu", "127.0.0.244"),
    HostSpec("blackwell", "127.0.0.245", gpus="blackwell"),
    HostSpec("rocky", "127.0.0.246"),
]
ARCH = "precompiled/cu128"
NEWER_ARCH = "precompiled/cu128-newglibc"
ELSEWHERE = "192.0.2.10"  # TEST-NET-1: never routed


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("launchfacts"), HOSTS, [ARCH]) as cluster:
        add_newer_glibc_variant(cluster.project, NEWER_ARCH)
        yield cluster


def far_worker(rig: RigCluster) -> dict[str, Any]:
    """``far`` named by a non-loopback target, reached on its loopback sshd."""
    worker = rig.worker("far", arch=ARCH)
    address = rig.rig.spec("far").address
    worker["ssh"] = {**worker["ssh"], "target": ELSEWHERE, "options": [f"HostName={address}"]}
    return worker


def test_loopback_controller_host_with_a_worker_elsewhere_is_a_warning(rig: RigCluster) -> None:
    path = rig.write([far_worker(rig)], "loopback.yaml", host="localhost", port=1337)
    done = rig.inv("preflight", "--json", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = [s for s in done.stderr.splitlines() if "controller.host" in s]
    assert line.startswith(
        "  warning  ctrl (controller, local): controller.host localhost resolves on the "
        "controller only to loopback (127.0.0.1"
    )
    assert f"but worker far is reached at {ELSEWHERE}, not a loopback address" in line
    verdicts = {v["host"]: v for v in json.loads(done.stdout)}
    assert verdicts["ctrl"]["status"] == "warning"
    assert any("controller.host localhost" in w for w in verdicts["ctrl"]["warnings"])
    assert verdicts["far"]["status"] == "ok", verdicts["far"]  # reached: over loopback
    near = rig.write([rig.worker("far", arch=ARCH)], "near.yaml", host="localhost")
    quiet = rig.inv("preflight", "--cluster-file", str(near))
    assert quiet.returncode == 0, quiet.stderr
    assert "controller.host" not in quiet.stderr  # every worker on this machine


def test_the_debian_hostname_trap_names_127_0_1_1(rig: RigCluster) -> None:
    """Debian's /etc/hosts maps the machine's name to 127.0.1.1: ``inv`` runs where a
    hosts file of that form is bind-mounted on /etc/hosts (a private mount namespace)."""
    hosts = rig.root / "debian-hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n127.0.1.1\tfdl-controller.example\tfdl-controller\n")
    path = rig.write([far_worker(rig)], "debian.yaml", host="fdl-controller", port=1337)
    mounted = 'mount --bind "$0" /etc/hosts && exec "$@"'
    done = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private", "sh", "-c", mounted),
            str(hosts),
            *inv_argv("preflight", "--cluster-file", str(path)),
        ],
        cwd=rig.root,
        env=rig.environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "  warning  ctrl (controller, local): controller.host fdl-controller resolves on the "
        f"controller only to loopback (127.0.1.1), but worker far is reached at {ELSEWHERE}"
    ) in done.stderr


def test_local_devices_all_on_a_host_without_a_gpu_is_refused_before_any_build(
    rig: RigCluster,
) -> None:
    workers = [
        rig.worker("nogpu", arch=ARCH, local_devices="all"),
        rig.worker("blackwell", arch=ARCH, local_devices="all"),
    ]
    path = rig.write(workers, "devices.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path))
    assert done.returncode != 0
    (line,) = [s for s in done.stderr.splitlines() if "local_devices" in s]
    assert line.startswith("  error    nogpu: local_devices: all, but this host has no NVIDIA GPU")
    assert "list the devices instead (e.g. local_devices: [0])" in line
    verdicts = {v["host"]: v for v in json.loads(done.stdout)}
    assert verdicts["blackwell"]["status"] == "ok"  # its RTX 5090 is counted
    built = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert built.returncode != 0
    assert "error    nogpu: local_devices: all" in built.stderr
    assert "nothing was built" in built.stderr and "Compiling" not in built.stderr
    assert not (rig.project / "target/cluster").exists()


def test_a_variant_needing_a_newer_glibc_is_refused_before_any_build(rig: RigCluster) -> None:
    workers = [rig.worker("rocky", arch=NEWER_ARCH), rig.worker("far", arch=ARCH)]
    path = rig.write(workers, "glibc.yaml")
    expected = (
        f"  error    rocky: libtorch variant {NEWER_ARCH} cannot load on this host: "
        f"libtorch.so needs {NEWER}"
    )
    for args in (("preflight",), ("prebuild", "--cmd", "ddp-bench")):
        done = rig.inv(*args, "--cluster-file", str(path))
        assert done.returncode != 0
        lines = done.stderr.splitlines()
        assert any(s.startswith(expected) for s in lines), done.stderr
        assert not any(s.startswith("  error    far") for s in lines)
    assert "nothing was built" in done.stderr and "Compiling" not in done.stderr
    assert not (rig.project / "target/cluster").exists()


def test_verification_names_the_version_real_ldd_reports(rig: RigCluster) -> None:
    """Delivery verification's script on a rig host, over its sshd, with the variant's
    library standing in for a binary: the same ldd line, read by the same parser."""
    lib = f"libtorch/{NEWER_ARCH}/lib"
    entry = PerHostEnvelope(f"{lib}/libtorch.so", f"{rig.project}/{lib}")
    script = verification_script(str(rig.project), entry)
    done = subprocess.run(
        rig.rig.ssh_argv("rocky", script), capture_output=True, text=True, timeout=60, check=True
    )
    copy = parse_verification(done.stdout)
    assert copy is not None and copy.sha256 is not None
    assert copy_problems("rocky", "p", copy, copy.sha256, None) == [
        f"rocky: versions not found with the envelope's LD_LIBRARY_PATH: libtorch.so needs {NEWER}"
    ]
