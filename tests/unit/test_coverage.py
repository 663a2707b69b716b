"""Coverage verdicts: a variant's ``.arch`` against a host's GPUs and driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl_tasks.config.model import Worker
from fdl_tasks.gpu.coverage import (
    ArchFile,
    driver_supports,
    judge_coverage,
    nvidia_covered,
    parse_arch_file,
    variant_cuda,
)
from fdl_tasks.gpu.gpus import Gpu, GpuReport
from fdl_tasks.preflight.gpu_gate import gate
from fdl_tasks.preflight.probe import HostVerdict, ProbeFacts

BLACKWELL = Gpu("nvidia", 0, "NVIDIA GeForce RTX 5090", "12.0", "580.65.06")
PASCAL = Gpu("nvidia", 0, "NVIDIA GeForce GTX 1080", "6.1", "550.127.05")
T4_470 = Gpu("nvidia", 0, "Tesla T4", None, "470.82.01")
MI25 = Gpu("amd", 0, "Radeon Instinct MI25", "gfx900")
STOCK_CU126 = ArchFile("2.7.0", "12.6", ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"))


def test_arch_file_as_flodl_writes_it() -> None:
    info = parse_arch_file("torch=2.10.0\ncuda=12.8\narchs=6.1 12.0\nsource=compiled\nx=y\n")
    assert info == ArchFile("2.10.0", "12.8", ("6.1", "12.0"), "compiled")
    assert parse_arch_file("cuda=none\n").archs is None


@pytest.mark.parametrize(
    ("cap", "archs", "covered"),
    [
        ("6.1", ("6.0",), True),  # X.y runs on X.z for z >= y
        ("6.1", ("6.1",), True),
        ("6.0", ("6.1",), False),
        ("7.5", ("5",), False),  # tokenised: '5' never matches 7.5
        ("7.5", ("7.0", "8.0"), True),
        ("12.0", ("8.0", "9.0"), False),  # sm_120 is not in sm_80/sm_90
        ("12.0", ("9.0+PTX",), True),  # PTX: compiled by the driver for newer GPUs
        ("8.6", ("sm_86",), True),
        ("8.6", ("compute_80",), True),
        ("8.0", ("compute_86",), False),  # PTX never runs on an older GPU
        ("12.0", ("6.1", "12.0"), True),
        ("9.0", ("9.0a",), True),  # arch-specific (sm_90a): an H100 runs it
        ("9.0", ("sm_90a",), True),
        ("10.0", ("9.0a",), False),  # ... and nothing but 9.0 does
        ("10.3", ("10.0f",), True),  # family-specific: its major, as plain code
    ],
)
def test_nvidia_binary_compatibility(cap: str, archs: tuple[str, ...], covered: bool) -> None:
    assert nvidia_covered(cap, archs) is covered


def test_driver_table() -> None:
    assert driver_supports("525.60.13", (12, 8)) is True
    assert driver_supports("525.60.12", (12, 0)) is False
    assert driver_supports("470.82.01", (12, 8)) is False
    assert driver_supports("470.82.01", (11, 8)) is True
    assert driver_supports("450.80.01", (11, 0)) is False
    assert driver_supports("575.51.03", (13, 0)) is False
    assert driver_supports("580.65.06", (13, 0)) is True
    assert driver_supports(None, (12, 8)) is None
    assert driver_supports("580", (14, 0)) is None
    assert variant_cuda("precompiled/cu128", None) == (12, 8)
    assert variant_cuda("builds/sm61-sm120", ArchFile(cuda="12.6")) == (12, 6)


def test_uncovered_gpu_is_one_line_with_the_two_ways_out() -> None:
    verdict = judge_coverage(
        "precompiled/cu126", "nvidia", GpuReport(("nvidia-smi",), (BLACKWELL,)), STOCK_CU126
    )
    assert verdict.state == "refused"
    (line,) = verdict.errors
    assert line.startswith("GPU 0 (NVIDIA GeForce RTX 5090, compute capability 12.0)")
    assert "variant precompiled/cu126" in line and "archs=5.0 6.0 7.0 7.5 8.0 8.6 9.0" in line
    assert "another variant" in line and "libtorch built for 12.0" in line


def test_pascal_on_a_stock_build_with_6_0_is_covered() -> None:
    report = GpuReport(("nvidia-smi",), (PASCAL,))
    assert judge_coverage("precompiled/cu126", "nvidia", report, STOCK_CU126).state == "ok"


def test_old_driver_refused_even_without_capability_or_arch_file() -> None:
    verdict = judge_coverage(
        "precompiled/cu128", "nvidia", GpuReport(("nvidia-smi",), (T4_470,)), None
    )
    assert verdict.state == "refused"
    (line,) = verdict.errors
    assert "driver 470.82.01" in line and "CUDA 12.8" in line and ">= 525.60.13" in line


def test_unknown_facts_never_refuse() -> None:
    no_tool = judge_coverage("precompiled/cu128", "nvidia", GpuReport(), STOCK_CU126)
    assert (no_tool.state, no_tool.errors, no_tool.warnings) == ("unknown", (), ())
    assert no_tool.notes == ("GPU coverage could not be checked: no nvidia-smi on the host",)
    no_arch = judge_coverage(
        "precompiled/cu128", "nvidia", GpuReport(("nvidia-smi",), (BLACKWELL,)), None
    )
    assert (no_arch.state, no_arch.errors, no_arch.warnings) == ("unknown", (), ())
    assert len(no_arch.notes) == 1


def test_amd_targets_match_exactly() -> None:
    report = GpuReport(("rocminfo",), (MI25,))
    ok = judge_coverage("precompiled/rocm6.2", "amd", report, ArchFile(archs=("gfx900:xnack-",)))
    assert ok.state == "ok"
    refused = judge_coverage("precompiled/rocm6.2", "amd", report, ArchFile(archs=("gfx906",)))
    assert "target gfx900" in refused.errors[0]


def test_cpu_variant_on_a_gpu_host_and_a_mixed_host_warn() -> None:
    report = GpuReport(("nvidia-smi", "rocminfo"), (BLACKWELL, MI25))
    cpu = judge_coverage("precompiled/cpu", "cpu", report, None)
    assert cpu.errors == () and any("CPU-only variant" in w for w in cpu.warnings)
    assert any("mixed-vendor host" in w for w in cpu.warnings)


def _verdict(gpus: GpuReport | None) -> HostVerdict:
    facts = ProbeFacts(data="ok", cpu_arch="x86_64", libc="ldd (GNU libc) 2.36", gpus=gpus)
    return HostVerdict("h", "ok", facts=facts, data_path="/data")


def test_gate_keeps_a_toolless_hosts_status_and_adds_one_note(tmp_path: Path) -> None:
    worker = Worker("h", "/p", arch="precompiled/cu128")
    gated = gate(_verdict(GpuReport()), worker, tmp_path)
    assert gated.status == "ok" and gated.errors == () and gated.warnings == ()
    assert len(gated.notes) == 1


def test_gate_reads_the_arch_file_on_the_controller(tmp_path: Path) -> None:
    variant = tmp_path / "libtorch/precompiled/cu126"
    variant.mkdir(parents=True)
    (variant / ".arch").write_text("torch=2.7.0\ncuda=12.6\narchs=8.0 9.0\nsource=stock\n")
    worker = Worker("h", "/p", arch="precompiled/cu126")
    gated = gate(_verdict(GpuReport(("nvidia-smi",), (BLACKWELL,))), worker, tmp_path)
    assert gated.status == "error" and "archs=8.0 9.0" in gated.errors[0]
    assert gated.coverage is not None and gated.coverage["state"] == "refused"


def test_gate_warns_for_an_unknown_name_unless_features_say(tmp_path: Path) -> None:
    worker = Worker("h", "/p", arch="builds/mybuild")
    assert "features: [rocm]" in gate(_verdict(GpuReport()), worker, tmp_path).warnings[0]
    explicit = Worker("h", "/p", arch="builds/mybuild", features=("rocm",))
    assert gate(_verdict(GpuReport()), explicit, tmp_path).warnings == ()


def test_auto_falling_back_to_cpu_without_a_gpu_listed_warns(tmp_path: Path) -> None:
    """A GPU box whose nvidia-smi is not on ssh's PATH must not silently run on its CPU."""
    (tmp_path / "libtorch/precompiled/cpu/lib").mkdir(parents=True)
    worker = Worker("h", "/p", arch="auto")
    toolless = gate(_verdict(GpuReport()), worker, tmp_path)
    assert toolless.arch == "precompiled/cpu" and toolless.status == "warning"
    assert "no GPU tool (nvidia-smi, rocminfo, KFD's topology) answered" in toolless.warnings[0]
    silent = gate(_verdict(GpuReport(("nvidia-smi",), ())), worker, tmp_path)
    assert "nvidia-smi listed no GPU" in silent.warnings[0]


def test_clean_keeps_every_variant_an_auto_host_may_get(tmp_path: Path) -> None:
    from fdl_tasks.config.installed_variants import expand_auto, installed_variants

    for arch in ("precompiled/cu128", "builds/sm61-sm120", "precompiled/cpu"):
        (tmp_path / "libtorch" / arch / "lib").mkdir(parents=True)
    (tmp_path / "libtorch/builds/no-lib").mkdir()
    assert [i.arch for i in installed_variants(tmp_path)] == [
        "precompiled/cpu",
        "precompiled/cu128",
        "builds/sm61-sm120",
    ]
    workers = [Worker("a", "/p", arch="auto"), Worker("b", "/p", arch="precompiled/cpu")]
    expanded = expand_auto(workers, tmp_path)
    assert sorted((w.host, w.arch) for w in expanded) == [
        ("a", "builds/sm61-sm120"),
        ("a", "precompiled/cpu"),
        ("a", "precompiled/cu128"),
        ("b", "precompiled/cpu"),
    ]


def test_a_gpu_without_capability_leaves_coverage_unknown_with_a_warning() -> None:
    report = GpuReport(("nvidia-smi",), (T4_470,))
    verdict = judge_coverage(
        "builds/sm61-sm120", "nvidia", report, ArchFile(cuda="11.8", archs=("7.5",))
    )
    assert verdict.state == "unknown" and verdict.errors == ()
    assert "does not report its compute capability" in verdict.warnings[0]
