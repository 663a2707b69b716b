"""Launch facts judged in preflight: the loopback controller host, ``local_devices: all``
without a GPU of the variant's vendor, symbol versions a host's libraries lack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from fdl_tasks.config.model import Cluster, Controller, SshSettings, Worker
from fdl_tasks.gpu.gpus import Gpu, GpuReport, Vendor
from fdl_tasks.gpu.launch_facts import all_devices_error, loopback_warning, only_loopback
from fdl_tasks.preflight.gpu_gate import gate
from fdl_tasks.preflight.preflight import controller_loopback, resolve
from fdl_tasks.preflight.probe import ControllerAbi, ProbeFacts, ProbeRequest, judge
from fdl_tasks.preflight.probe import parse_facts as parse_probe
from fdl_tasks.preflight.unmet_versions import UnmetVersion, parse_unmet, unmet_text
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.verification import copy_problems, parse_verification, verification_script
from fdl_tasks.ssh.answers import BEGIN, END

#: Real ldd output: rockylinux:9 loading a libtorch built on a newer distribution.
ROCKY9 = (Path(__file__).parents[1] / "data/ldd/rockylinux9-newer-libtorch.txt").read_text()
SATISFIED = """\
\tlinux-vdso.so.1 (0x00007ffd0d7f9000)
\tlibtorch_cpu.so => /lt/libtorch_cpu.so (0x00007f0e88000000)
\tlibm.so.6 => /lib64/libm.so.6 (0x00007f0e8a000000)
\tlibmissing.so => not found
"""


def test_unmet_versions_from_real_ldd_output() -> None:
    unmet = parse_unmet(ROCKY9.splitlines())
    assert unmet == (
        UnmetVersion("/lt/libtorch_cpu.so", "GLIBC_2.35"),
        UnmetVersion("/lt/libtorch_cpu.so", "GLIBCXX_3.4.30"),
        UnmetVersion("/lt/libc10.so", "GLIBCXX_3.4.30"),
    )
    assert unmet_text(unmet) == (
        "libtorch_cpu.so needs GLIBC_2.35, GLIBCXX_3.4.30; libc10.so needs GLIBCXX_3.4.30"
    )
    assert parse_unmet(SATISFIED.splitlines()) == ()  # "=> not found" is another fact
    assert parse_unmet([]) == ()
    # Newer glibc quotes '…'; a path may hold spaces.
    newer = "/a b/x.so: /lib/libc.so.6: version 'GLIBC_2.99' not found (required by /a b/x.so)"
    assert parse_unmet([newer]) == (UnmetVersion("/a b/x.so", "GLIBC_2.99"),)


def answers(*lines: str) -> str:
    return "\n".join([BEGIN, "data=ok", *lines, END])


WORKER = Worker("gpu1", "/mnt/p", "precompiled/cu128")


def test_the_probe_ldds_a_known_variant_only_when_prebuilding() -> None:
    script = ProbeRequest.for_host(WORKER, abi=True).script()
    assert "/mnt/p/libtorch/precompiled/cu128/lib/lib*.so" in script
    assert "LD_LIBRARY_PATH=/mnt/p/libtorch/precompiled/cu128/lib ldd" in script
    assert "ldd" not in ProbeRequest.for_host(WORKER, abi=False).script()
    for arch in (None, "auto"):
        unknown = attrs.evolve(WORKER, arch=arch)
        assert "lib*.so" not in ProbeRequest.for_host(unknown, abi=True).script()
    rocm = attrs.evolve(WORKER, arch="precompiled/rocm6.2")  # the launcher's library path
    assert "LD_LIBRARY_PATH=/opt/rocm/lib:/mnt/p/libtorch/precompiled/rocm6.2/lib" in (
        ProbeRequest.for_host(rocm, abi=True).script()
    )


def test_unmet_versions_are_an_error_naming_library_and_version() -> None:
    request = ProbeRequest.for_host(WORKER, abi=True)
    facts = parse_probe(answers(*(f"unmet={line}" for line in ROCKY9.splitlines()[:3])))
    assert facts is not None
    verdict = judge("gpu1", request, facts, ControllerAbi("x86_64", (2, 36)))
    assert verdict.status == "error"
    (error,) = [e for e in verdict.errors if "cannot load" in e]
    assert error.startswith(
        "libtorch variant precompiled/cu128 cannot load on this host: libtorch_cpu.so needs "
        "GLIBC_2.35, GLIBCXX_3.4.30; libc10.so needs GLIBCXX_3.4.30"
    )
    assert "/mnt/p/libtorch/precompiled/cu128/lib" in error
    clean = judge("gpu1", request, parse_probe(answers()), ControllerAbi("x86_64", (2, 36)))
    assert not any("cannot load" in e for e in clean.errors)


def test_verification_names_the_versions_the_binary_cannot_find(tmp_path: Path) -> None:
    entry = PerHostEnvelope("bin/tool", "/x/lib")
    assert "version .* not found" in verification_script(str(tmp_path), entry)
    line = (
        "/p/bin/tool: /lib64/libc.so.6: version `GLIBC_2.35' not found "
        "(required by /x/lib/libtorch.so)"
    )
    copy = parse_verification(answers("sha256=abc", f"unmet={line}"))
    assert copy is not None and copy.unmet == (UnmetVersion("/x/lib/libtorch.so", "GLIBC_2.35"),)
    assert copy_problems("gpu1", "/p/bin/tool", copy, "abc", None) == [
        "gpu1: versions not found with the envelope's LD_LIBRARY_PATH: libtorch.so needs GLIBC_2.35"
    ]


@pytest.mark.parametrize(
    ("addresses", "loopback"),
    [
        (("127.0.1.1",), True),
        (("127.0.0.1", "::1"), True),
        (("::ffff:127.0.0.1",), True),
        (("127.0.1.1", "10.0.0.5"), False),
        (("192.0.2.10",), False),
        ((), False),
        (None, False),
    ],
)
def test_only_loopback(addresses: tuple[str, ...] | None, loopback: bool) -> None:
    assert only_loopback(addresses) is loopback


def test_loopback_controller_host_with_a_worker_elsewhere_is_a_warning() -> None:
    far = [("gpu1", "node-a", ("192.0.2.10",))]
    warning = loopback_warning("vm", ("127.0.1.1",), far)
    assert warning is not None
    assert warning.startswith(
        "controller.host vm resolves on the controller only to loopback (127.0.1.1), but "
        "worker gpu1 is reached at node-a, not a loopback address"
    )
    literal = loopback_warning("127.0.0.1", ("127.0.0.1",), far)
    assert literal is not None and literal.startswith("controller.host 127.0.0.1 (127.0.0.1),")
    unresolved_worker = [("gpu1", "node-a", None)]  # counted as not loopback
    assert loopback_warning("vm", ("127.0.1.1",), unresolved_worker) is not None


def test_no_loopback_warning_when_it_cannot_mislead() -> None:
    far = [("gpu1", "node-a", ("192.0.2.10",))]
    assert loopback_warning("ctl", ("10.0.0.1",), far) is None  # a real address
    assert loopback_warning("ctl", None, far) is None  # unresolved: flodl warns itself
    near = [("a", "127.0.0.2", ("127.0.0.2",)), ("b", "localhost", ("::1",))]
    assert loopback_warning("localhost", ("127.0.0.1",), near) is None  # one machine


def test_worker_targets_are_resolved_only_until_one_is_elsewhere() -> None:
    asked: list[str] = []

    def targets() -> Iterator[tuple[str, str, tuple[str, ...]]]:
        for label in ("a", "b", "c"):
            asked.append(label)
            yield label, label, ("127.0.0.2",) if label == "a" else ("192.0.2.1",)

    assert loopback_warning("localhost", ("127.0.0.1",), targets()) is not None
    assert asked == ["a", "b"]
    asked.clear()
    assert loopback_warning("ctl", ("10.0.0.1",), targets()) is None
    assert asked == []


def test_controller_loopback_resolves_names_here_and_skips_tunneled_workers() -> None:
    assert resolve("192.0.2.10") == ("192.0.2.10",)  # a literal is never looked up
    far = Worker("gpu1", "/p", ssh=SshSettings(target="192.0.2.10"))
    cluster = Cluster(Controller("/p", host="localhost"), (far,))
    warning = controller_loopback(cluster, cluster.workers)
    assert warning is not None and "controller.host localhost resolves" in warning
    tunneled = attrs.evolve(far, tunnel=True)  # dials its own loopback forward
    assert controller_loopback(cluster, (tunneled,)) is None
    unset = attrs.evolve(cluster, controller=Controller("/p"))
    assert controller_loopback(unset, cluster.workers) is None


NVIDIA = Gpu("nvidia", 0, "NVIDIA GeForce RTX 5090", "12.0", "580.65.06")
AMD = Gpu("amd", 0, "Radeon Instinct MI25", "gfx900")


@pytest.mark.parametrize(
    ("devices", "vendor", "gpus", "refused"),
    [
        ("all", "nvidia", (NVIDIA,), False),
        ("all", "nvidia", (AMD,), True),
        ("all", "amd", (AMD,), False),
        ("all", "amd", (NVIDIA,), True),
        ("all", "cpu", (AMD,), False),  # flodl counts both vendors
        ("all", "cpu", (), True),
        ((0,), "nvidia", (), False),
        ([0], "nvidia", (), False),
        (None, "nvidia", (), False),
    ],
)
def test_local_devices_all_needs_a_gpu_flodl_counts(
    devices: object, vendor: Vendor, gpus: tuple[Gpu, ...], refused: bool
) -> None:
    error = all_devices_error(devices, vendor, GpuReport(("nvidia-smi",), gpus))
    assert (error is not None) is refused
    if error:
        assert "local_devices: all" in error and "local_devices: [0]" in error


def test_local_devices_all_error_says_what_answered() -> None:
    amd = all_devices_error("all", "nvidia", GpuReport(("rocminfo",), (AMD,)))
    assert amd is not None and "no NVIDIA GPU (rocminfo listed no NVIDIA GPU)" in amd
    silent = all_devices_error("all", "nvidia", GpuReport())
    assert silent is not None and "no GPU tool answered over ssh: nvidia-smi" in silent


def test_the_gpu_gate_refuses_local_devices_all_on_a_host_without_gpus(tmp_path: Path) -> None:
    worker = attrs.evolve(WORKER, local_devices="all")
    facts = ProbeFacts(data="ok", gpus=GpuReport())
    verdict = judge("gpu1", ProbeRequest.for_host(worker, True), facts, ControllerAbi("x", None))
    gated = gate(verdict, worker, tmp_path)
    assert gated.status == "error"
    assert any("local_devices: all, but this host has no NVIDIA GPU" in e for e in gated.errors)
    listed = gate(verdict, attrs.evolve(worker, local_devices=(0,)), tmp_path)
    assert not any("local_devices" in e for e in listed.errors)
