"""``arch: auto``: which installed variant a host gets, and why the others were refused."""

from __future__ import annotations

from fdl_tasks.gpu.auto_arch import Installed, choose
from fdl_tasks.gpu.coverage import ArchFile
from fdl_tasks.gpu.gpus import Gpu, GpuReport

BLACKWELL = Gpu("nvidia", 0, "NVIDIA GeForce RTX 5090", "12.0", "580.65.06")
PASCAL = Gpu("nvidia", 0, "NVIDIA GeForce GTX 1080", "6.1", "550.127.05")
MI25 = Gpu("amd", 0, "Radeon Instinct MI25", "gfx900")
STOCK = ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0")


def nv(arch: str, cuda: str, archs: tuple[str, ...], cpu: str = "x86_64") -> Installed:
    return Installed(arch, ArchFile("2.7.0", cuda, archs), cpu)


INSTALLED = [
    nv("builds/sm61-sm120", "12.8", ("6.1", "12.0")),
    nv("precompiled/cu126", "12.6", STOCK),
    nv("precompiled/cu128", "12.8", ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")),
    nv("precompiled/cu130", "13.0", ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")),
    Installed("precompiled/rocm6.2", ArchFile(archs=("gfx900", "gfx90a")), "x86_64"),
    Installed("precompiled/cpu", None, "x86_64"),
    Installed("precompiled/cpu-aarch64", None, "aarch64"),
]


def nvidia(*gpus: Gpu) -> GpuReport:
    return GpuReport(("nvidia-smi",), gpus)


def test_newest_cuda_the_driver_supports_then_precompiled_before_builds() -> None:
    # cu130 covers 12.0 and driver 580 runs CUDA 13; it wins over the CUDA 12.8 ones.
    assert choose(INSTALLED, nvidia(BLACKWELL), "x86_64").arch == "precompiled/cu130"
    old = Gpu("nvidia", 0, "NVIDIA GeForce RTX 5090", "12.0", "570.124.04")
    choice = choose(INSTALLED, nvidia(old), "x86_64")
    assert choice.arch == "precompiled/cu128"  # same CUDA as builds/sm61-sm120: precompiled
    assert ("precompiled/cu130", "CUDA 13.0 needs a newer driver than 570.124.04") in (
        choice.refused
    )


def test_every_gpu_of_the_host_must_be_covered() -> None:
    choice = choose(INSTALLED, nvidia(PASCAL, attrs_index(BLACKWELL, 1)), "x86_64")
    assert choice.arch == "builds/sm61-sm120"  # the only one with 6.x and 12.0


def attrs_index(gpu: Gpu, index: int) -> Gpu:
    import attrs

    return attrs.evolve(gpu, index=index)


def test_amd_and_cpu_hosts() -> None:
    assert choose(INSTALLED, GpuReport(("rocminfo",), (MI25,)), "x86_64").arch == (
        "precompiled/rocm6.2"
    )
    assert choose(INSTALLED, GpuReport(), "x86_64").arch == "precompiled/cpu"
    assert choose(INSTALLED, GpuReport(), "aarch64").arch == "precompiled/cpu-aarch64"


def test_no_candidate_says_why_for_each() -> None:
    choice = choose(INSTALLED[:2], nvidia(Gpu("nvidia", 0, "Tesla K80", "3.7", "470.82.01")), None)
    assert choice.arch is None
    assert dict(choice.refused) == {
        "builds/sm61-sm120": "does not cover GPU 0 (Tesla K80, 3.7)",
        "precompiled/cu126": "does not cover GPU 0 (Tesla K80, 3.7)",
    }
    assert "builds/sm61-sm120: does not cover" in choice.summary()


def test_the_choice_does_not_depend_on_the_listing_order() -> None:
    report = nvidia(PASCAL)
    assert choose(INSTALLED, report, "x86_64") == choose(INSTALLED[::-1], report, "x86_64")
