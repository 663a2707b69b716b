"""GPUs on the rig, through the real ``inv``: an AMD host, uncovered GPUs, old drivers.

No GPU exists here: each GPU host's ``nvidia-smi`` / ``rocminfo`` is a shim on its
real sshd that prints a real machine's captured output (rig/gpushims.py,
tests/data/gpus). The AMD host's variant is a stub libtorch that needs
``libamdhip64.so``; its bundled copy kills the process when loaded, the system one
(``/opt/rocm/lib``) does not (rig/rocm.py), so the library order is tested by
running the binary.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from fdl_tasks.publish.envelope import decode
from rig.docker_builder import BUILDER_IMAGE
from rig.harness import OWNER_LABEL, RigCluster, start_rig
from rig.rocm import add_rocm_variant, install_system_rocm, write_arch_file
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("amd", "127.0.0.215", gpus="mi25x2"),
    HostSpec("blackwell", "127.0.0.216", gpus="blackwell"),
    HostSpec("olddriver", "127.0.0.217", gpus="t4-470"),
    HostSpec("pascal", "127.0.0.218", gpus="pascal"),
    HostSpec("plain", "127.0.0.219"),
    HostSpec("a6000", "127.0.0.220", gpus="a6000x2"),
    HostSpec("mixed", "127.0.0.221", gpus="mixed"),
]
ROCM = "precompiled/rocm6.2"
VARIANTS = ("precompiled/cu126", "precompiled/cu128", "builds/sm61-sm120", "precompiled/cpu")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("gpus"), HOSTS, VARIANTS, docker=True) as cluster:
        install_system_rocm()
        add_rocm_variant(cluster.project, ROCM)
        write_arch_file(cluster.project, "precompiled/cu126", "12.6", "5.0 6.0 7.0 7.5 8.0 8.6 9.0")
        write_arch_file(cluster.project, "builds/sm61-sm120", "12.8", "6.1 12.0")
        yield cluster


def controller_entry(rig: RigCluster) -> dict[str, Any]:
    return {
        "host": "ctrl",
        "path": str(rig.project),
        "arch": "precompiled/cu128",
        "data_path": str(rig.project),
    }


def prebuild(rig: RigCluster, archs: dict[str, str], name: str, **controller: Any):  # type: ignore[no-untyped-def]
    workers = [controller_entry(rig), *(rig.worker(h, arch=a) for h, a in archs.items())]
    path = rig.write(workers, name, **controller)
    return rig.inv("prebuild", "--cmd", "ddp-bench", "--json", "--cluster-file", str(path))


def test_amd_host_builds_with_rocm_and_runs_with_the_system_runtime_first(rig: RigCluster) -> None:
    done = prebuild(rig, {"amd": ROCM, "pascal": "builds/sm61-sm120"}, "amd.yaml")
    assert done.returncode == 0, done.stderr
    envelopes = decode(done.stdout, "stdout")
    entry = envelopes["amd"]
    # flodl's rule, byte for byte: "/opt/rocm/lib:" + <worker.path>/libtorch/<arch>/lib.
    assert entry.ld_library_path == f"/opt/rocm/lib:{rig.project}/libtorch/{ROCM}/lib"
    assert envelopes["pascal"].ld_library_path == f"{rig.project}/libtorch/builds/sm61-sm120/lib"
    # Built with --features rocm, never cuda; it runs on the host, the system runtime first.
    ran = rig.run_on_host("amd", str(rig.project), entry)
    assert ran == f"ddp-bench variant={ROCM} cuda=off rocm=on"
    pascal = rig.run_on_host("pascal", str(rig.project), envelopes["pascal"])
    assert pascal == "ddp-bench variant=builds/sm61-sm120 cuda=on"
    # The same binary with libtorch's bundle first dies, as a real mismatch does.
    bundle_first = attrs.evolve(entry, ld_library_path=f"{rig.project}/libtorch/{ROCM}/lib")
    with pytest.raises(AssertionError, match="bundled ROCm runtime"):
        rig.run_on_host("amd", str(rig.project), bundle_first)


def _created(rig: RigCluster, since: float, field: str) -> list[str]:
    """``field`` of each container of this rig created since ``since`` (docker's own log)."""
    events = subprocess.run(
        [
            "docker",
            "events",
            "--since",
            f"{since:.3f}",
            "--until",
            f"{time.time():.3f}",
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            f"label={OWNER_LABEL}={rig.owner}",
            "--format",
            "{{.Actor." + field + "}}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return sorted(events.stdout.split())


def test_uncovered_gpu_and_old_driver_refused_before_any_build(rig: RigCluster) -> None:
    docker = rig.docker_settings()
    first = prebuild(rig, {"pascal": "builds/sm61-sm120"}, "before.yaml", docker=docker)
    assert first.returncode == 0, first.stderr
    published = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    before = published.read_bytes()
    since = time.time()
    archs = {
        "blackwell": "precompiled/cu126",  # sm_120 is not in archs= 5.0 … 9.0
        "olddriver": "precompiled/cu128",  # driver 470 < CUDA 12's 525.60.13
        "pascal": "builds/sm61-sm120",
    }
    done = prebuild(rig, archs, "refused.yaml", docker=docker)
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    (blackwell,) = [line for line in lines if "error    blackwell:" in line]
    assert "GPU 0 (NVIDIA GeForce RTX 5090, compute capability 12.0)" in blackwell
    assert "precompiled/cu126" in blackwell and "archs=5.0 6.0 7.0 7.5 8.0 8.6 9.0" in blackwell
    assert "another variant" in blackwell and "libtorch built for 12.0" in blackwell
    (old,) = [line for line in lines if "error    olddriver:" in line]
    assert "driver 470.82.01" in old and "CUDA 12.8" in old and ">= 525.60.13" in old
    assert not any("error    pascal" in line for line in lines)
    assert "Compiling" not in done.stderr
    assert _created(rig, since, "ID") == []  # no container started at all
    assert published.read_bytes() == before  # the other hosts' envelope untouched
    assert "Traceback" not in done.stderr


def test_flodl_rig_without_gpu_tools_keeps_its_verdict(rig: RigCluster) -> None:
    workers = [controller_entry(rig), rig.worker("plain", arch="precompiled/cu128")]
    path = rig.write(workers, "plain.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    plain = [line for line in done.stderr.splitlines() if "plain" in line]
    assert [line.strip() for line in plain] == [
        "note     plain: GPU coverage could not be checked: no nvidia-smi on the host"
    ]
    assert "preflight: 2 ok, 0 with warnings, 0 with errors" in done.stderr
    (verdict,) = [v for v in json.loads(done.stdout) if v["host"] == "plain"]
    assert verdict["status"] == "ok" and verdict["gpus"] == [] and verdict["gpu_tools"] == []
    assert verdict["coverage"]["state"] == "unknown"


def test_preflight_json_lists_each_hosts_gpus_and_verdict(rig: RigCluster) -> None:
    archs = {"amd": ROCM, "blackwell": "builds/sm61-sm120", "pascal": "precompiled/cpu"}
    workers = [controller_entry(rig), *(rig.worker(h, arch=a) for h, a in archs.items())]
    path = rig.write(workers, "json.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    verdicts = {v["host"]: v for v in json.loads(done.stdout)}
    assert [g["target"] for g in verdicts["amd"]["gpus"]] == ["gfx900", "gfx900"]
    assert verdicts["amd"]["coverage"]["state"] == "ok"
    assert verdicts["blackwell"]["gpus"] == [
        {
            "vendor": "nvidia",
            "index": 0,
            "name": "NVIDIA GeForce RTX 5090",
            "target": "12.0",
            "driver": "580.65.06",
        }
    ]
    assert verdicts["blackwell"]["coverage"]["state"] == "ok"
    assert verdicts["pascal"]["status"] == "warning"  # a CPU variant on a GPU host
    assert any("CPU-only variant" in w for w in verdicts["pascal"]["warnings"])


AUTO_CHOICES = {
    "blackwell": "builds/sm61-sm120",  # 12.0: only sm61-sm120 lists it
    "a6000": "precompiled/cu126",  # 8.6: the stock build; sm61-sm120 has no 8.x
    "amd": ROCM,
    "plain": "precompiled/cpu",  # no GPU tool, no GPU listed: a CPU node
}


def test_arch_auto_chooses_builds_and_runs_as_if_written_by_hand(rig: RigCluster) -> None:
    done = prebuild(rig, dict.fromkeys(AUTO_CHOICES, "auto"), "auto.yaml")
    assert done.returncode == 0, done.stderr
    for host, arch in AUTO_CHOICES.items():
        assert f"note     {host}: arch: auto chose {arch}" in done.stderr
    envelopes = decode(done.stdout, "stdout")
    for host, arch in AUTO_CHOICES.items():
        ran = rig.run_on_host(host, str(rig.project), envelopes[host])
        assert ran.startswith(f"ddp-bench variant={arch} "), ran
    launched = rig.inv(
        "launch", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "auto.yaml")
    )
    assert launched.returncode == 0, launched.stderr
    for host, arch in AUTO_CHOICES.items():
        assert f"[{host}] ddp-bench variant={arch} " in launched.stdout, launched.stdout
    # Exactly as if written by hand: the same envelope, the same target dirs (no rebuild).
    by_hand = prebuild(rig, AUTO_CHOICES, "by-hand.yaml")
    assert by_hand.returncode == 0, by_hand.stderr
    assert by_hand.stdout == done.stdout
    assert "Compiling ddp-bench" not in by_hand.stderr
    again = prebuild(rig, dict.fromkeys(AUTO_CHOICES, "auto"), "auto.yaml")
    assert again.stdout == done.stdout  # stable from run to run


def test_build_host_chooses_an_auto_arch_from_its_probe(rig: RigCluster) -> None:
    """``build-host`` probes its host first, so ``arch: auto`` works there as in prebuild;
    the entry is what prebuild published for that host."""
    done = prebuild(rig, dict.fromkeys(AUTO_CHOICES, "auto"), "auto-one.yaml")
    assert done.returncode == 0, done.stderr
    args = ("--host", "blackwell", "--cmd", "ddp-bench", "--json")
    # -v: prebuild said that note already for this cluster file
    one = rig.inv("build-host", *args, "-v", "--cluster-file", str(rig.root / "auto-one.yaml"))
    assert one.returncode == 0, one.stderr
    assert "note     blackwell: arch: auto chose builds/sm61-sm120" in one.stderr
    assert decode(one.stdout, "stdout") == {"blackwell": decode(done.stdout, "stdout")["blackwell"]}


def test_arch_auto_without_a_candidate_lists_each_variant(rig: RigCluster) -> None:
    done = prebuild(rig, {"olddriver": "auto", "pascal": "auto"}, "auto-none.yaml")
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if "error    olddriver:" in x]
    assert (
        "arch: auto: no installed variant fits this host (Tesla T4 (no architecture reported))"
        in line
    )
    for arch in ("builds/sm61-sm120", "precompiled/cu126", "precompiled/cu128", ROCM):
        assert f"{arch}: " in line, line
    assert "precompiled/cpu: CPU-only variant, the host is NVIDIA" in line
    assert "Compiling" not in done.stderr and "Traceback" not in done.stderr


ROCM_IMAGE = "fdl-rig-rocm:6.2"


def test_each_vendor_builds_in_its_own_image_and_one_for_both_is_refused(rig: RigCluster) -> None:
    subprocess.run(["docker", "tag", f"{BUILDER_IMAGE}:12.8", ROCM_IMAGE], check=True)
    docker = rig.docker_settings()
    archs = {"amd": ROCM, "blackwell": "builds/sm61-sm120"}
    since = time.time()
    refused = prebuild(rig, archs, "one-image.yaml", docker=docker)
    assert refused.returncode != 0
    assert "NVIDIA and AMD hosts but one build environment (NVIDIA: blackwell; AMD: amd)" in (
        refused.stderr
    )
    assert "gpu_builds: {amd: {image: ...}}" in refused.stderr
    assert _created(rig, since, "Attributes.image") == [] and "Traceback" not in refused.stderr
    shutil.rmtree(rig.project / "target", ignore_errors=True)  # both build: no stamp skips one
    since = time.time()
    done = prebuild(
        rig, archs, "two-images.yaml", docker=docker, gpu_builds={"amd": {"image": ROCM_IMAGE}}
    )
    assert done.returncode == 0, done.stderr
    assert _created(rig, since, "Attributes.image") == sorted([ROCM_IMAGE, f"{BUILDER_IMAGE}:12.8"])
    envelopes = decode(done.stdout, "stdout")
    assert rig.run_on_host("amd", str(rig.project), envelopes["amd"]).endswith("rocm=on")


def test_a_mixed_vendor_host_is_named_and_checked_for_its_variants_vendor(rig: RigCluster) -> None:
    workers = [controller_entry(rig), rig.worker("mixed", arch=ROCM)]
    path = rig.write(workers, "mixed.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "warning  mixed:" in x]
    assert "mixed-vendor host: it has AMD and NVIDIA GPUs" in line and ROCM in line
    (verdict,) = [v for v in json.loads(done.stdout) if v["host"] == "mixed"]
    assert [g["vendor"] for g in verdict["gpus"]] == ["nvidia", "amd", "amd"]
    assert verdict["coverage"]["state"] == "ok"  # both MI25s are in the ROCm variant's archs
