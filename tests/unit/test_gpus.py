"""GPU vendors from variant names, the GPU tools' answers, and the probe's GPU lines.

The tools' outputs are real captures (tests/data/gpus/README.md says where each came
from); the probe's shell lines run for real against the rig's shims of those tools.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fdl_tasks.config.model import Worker
from fdl_tasks.config.variants import cargo_features
from fdl_tasks.gpu.gpus import (
    Gpu,
    classify,
    cuda_release,
    features_for,
    gfx_from_kfd,
    named_cuda,
    parse_kfd,
    parse_nvidia_smi,
    parse_rocminfo,
    runtime_library_path,
    unknown_name_warning,
    vendor_of,
)
from fdl_tasks.preflight.probe import ProbeRequest, parse_facts
from fdl_tasks.publish.envelope import PerHostEnvelope
from rig.gpushims import gpu_shims

DATA = Path(__file__).resolve().parents[1] / "data" / "gpus"


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("12.8", ("12", "8", "0")),
        ("12.6.3", ("12", "6", "3")),
        ("012.8", ("012", "8", "0")),
        ("12", None),
        ("12.8.", None),
        ("cu128", None),
        ("", None),
    ],
)
def test_one_parser_reads_a_cuda_release(text: str, release: tuple[str, ...] | None) -> None:
    """Digits as written: the image tag repeats them; the coverage reads them as numbers."""
    assert cuda_release(text) == release


@pytest.mark.parametrize(
    ("arch", "cuda"),
    [
        ("precompiled/cu128", (12, 8)),
        ("precompiled/cu118", (11, 8)),
        ("precompiled/cu1300", (130, 0)),
        ("precompiled/cu12", (1, 2)),
        ("precompiled/cu1", None),
        ("builds/sm61-sm120", None),
        ("precompiled/cpu", None),
        ("cu128/cpu", None),
    ],
)
def test_a_variant_name_encodes_its_cuda_release(arch: str, cuda: tuple[int, int] | None) -> None:
    assert named_cuda(arch) == cuda


@pytest.mark.parametrize(
    ("arch", "vendor"),
    [
        ("precompiled/cpu", "cpu"),
        ("precompiled/cpu-aarch64", "cpu"),
        ("precompiled/cu128", "nvidia"),
        ("precompiled/cu126-pt27", "nvidia"),
        ("builds/sm61-sm120", "nvidia"),
        ("precompiled/rocm6.2", "amd"),
        ("precompiled/rocm70", "amd"),
        ("builds/gfx1030-gfx1100", "amd"),
        ("builds/mybuild", None),
        ("builds/cuda", None),  # a prefix counts only with a digit after it
        ("builds/rocm", None),
        ("builds/cpux", None),
    ],
)
def test_vendor_from_the_basename_as_flodl(arch: str, vendor: str | None) -> None:
    assert classify(arch) == vendor


def test_features_per_vendor_never_cuda_for_amd() -> None:
    assert cargo_features("precompiled/rocm6.2") == ("rocm",)
    assert cargo_features("builds/gfx90a") == ("rocm",)
    assert cargo_features("precompiled/cu128") == ("cuda",)
    assert cargo_features("precompiled/cpu") == ()
    assert cargo_features("precompiled/cpu-aarch64") == ()
    assert cargo_features("builds/mybuild") == ("cuda",)  # flodl: unknown → NVIDIA, warned


def test_explicit_features_win_and_decide_the_vendor() -> None:
    assert features_for("builds/mybuild", ("rocm",)) == ("rocm",)
    assert vendor_of("builds/mybuild", ("rocm",)) == "amd"
    assert vendor_of("precompiled/cu128", ()) == "cpu"
    assert cargo_features("builds/mybuild", ()) == ()


def test_unknown_name_warning_names_it_and_the_way_out() -> None:
    warning = unknown_name_warning("builds/mybuild")
    assert warning is not None
    assert "'mybuild'" in warning and "--features cuda" in warning
    assert "features: [rocm]" in warning
    assert unknown_name_warning("builds/sm61-sm120") is None


def test_rocm_envelope_puts_the_system_runtime_first_as_flodl() -> None:
    worker = Worker("amd", "/home/me/rdl/", arch="precompiled/rocm6.2")
    entry = PerHostEnvelope.for_worker(worker, "train", "")
    # flodl: format!("{}:{libtorch_lib}", "/opt/rocm/lib") with the worker path trimmed.
    assert entry.ld_library_path == "/opt/rocm/lib:/home/me/rdl/libtorch/precompiled/rocm6.2/lib"
    nvidia = PerHostEnvelope.for_worker(attrs_evolve(worker, "builds/sm61-sm120"), "train", "")
    assert nvidia.ld_library_path == "/home/me/rdl/libtorch/builds/sm61-sm120/lib"
    assert runtime_library_path("cpu", "/x/lib") == "/x/lib"


def attrs_evolve(worker: Worker, arch: str) -> Worker:
    import attrs

    return attrs.evolve(worker, arch=arch)


def test_nvidia_smi_captures() -> None:
    (blackwell,) = parse_nvidia_smi((DATA / "nvidia-smi-blackwell.csv").read_text().splitlines())
    assert blackwell == Gpu("nvidia", 0, "NVIDIA GeForce RTX 5090", "12.0", "580.65.06")
    two = parse_nvidia_smi((DATA / "nvidia-smi-a6000x2.csv").read_text().splitlines())
    assert [(g.index, g.target) for g in two] == [(0, "8.6"), (1, "8.6")]
    (t4,) = parse_nvidia_smi(
        (DATA / "nvidia-smi-t4-470-nocap.csv").read_text().splitlines(), with_capability=False
    )
    assert t4 == Gpu("nvidia", 0, "Tesla T4", None, "470.82.01")


def test_nvidia_smi_odd_rows() -> None:
    rows = ["0, Tesla K80, [N/A], 470.82.01", "1, Weird, Name, 8.6, 550.1", "garbage", ""]
    gpus = parse_nvidia_smi(rows)
    assert gpus[0].target is None and gpus[0].driver == "470.82.01"
    assert gpus[1].name == "Weird, Name" and gpus[1].target == "8.6"
    assert len(gpus) == 2


def test_rocminfo_capture_lists_gpu_agents_only() -> None:
    gpus = parse_rocminfo((DATA / "rocminfo-mi25x2.txt").read_text().splitlines())
    assert gpus == (
        Gpu("amd", 0, "Radeon Instinct MI25", "gfx900"),
        Gpu("amd", 1, "Radeon Instinct MI25", "gfx900"),
    )


def test_kfd_topology_targets() -> None:
    assert gfx_from_kfd(90010) == "gfx90a"
    assert gfx_from_kfd(100300) == "gfx1030"
    assert gfx_from_kfd(110000) == "gfx1100"
    assert gfx_from_kfd(0) is None
    gpus = parse_kfd(["0:0", "1:90010", "2:bogus", "3:100300"])
    assert [g.target for g in gpus] == ["gfx90a", "gfx1030"]


def _probe_with(tmp_path: Path, profile: str | None) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in gpu_shims("h", profile).items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}
    script = ProbeRequest(str(tmp_path), True, abi=True).script()
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("profile", "tools", "targets"),
    [
        ("blackwell", ("nvidia-smi",), [("nvidia", "12.0", "580.65.06")]),
        ("t4-470", ("nvidia-smi",), [("nvidia", None, "470.82.01")]),
        ("mi25x2", ("rocminfo",), [("amd", "gfx900", None), ("amd", "gfx900", None)]),
        (
            "mixed",
            ("nvidia-smi", "rocminfo"),
            [("nvidia", "12.0", "580.65.06"), ("amd", "gfx900", None), ("amd", "gfx900", None)],
        ),
        (None, (), []),
    ],
)
def test_the_probe_asks_the_tools_in_its_one_script(
    tmp_path: Path, profile: str | None, tools: tuple[str, ...], targets: list[object]
) -> None:
    done = _probe_with(tmp_path, profile)
    assert done.returncode == 0, done.stderr
    facts = parse_facts(done.stdout)
    assert facts is not None and facts.gpus is not None
    assert facts.gpus.tools == tools
    assert [(g.vendor, g.target, g.driver) for g in facts.gpus.gpus] == targets


def test_a_probe_without_the_abi_gate_asks_nothing_about_gpus(tmp_path: Path) -> None:
    facts = parse_facts(
        subprocess.run(
            ["sh", "-c", ProbeRequest(str(tmp_path), True, abi=False).script()],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert facts is not None and facts.gpus is None


def test_a_hung_nvidia_smi_is_not_asked_again(tmp_path: Path) -> None:
    """timeout(1) ends a wedged query with 124: asking the older form too would spend a
    second tool budget and push the whole probe past its own timeout."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit 124\n')
    (bindir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}
    script = ProbeRequest(str(tmp_path), True, abi=True).script()
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert len(calls.read_text().splitlines()) == 1
    facts = parse_facts(done.stdout)
    assert facts is not None and facts.gpus is not None
    assert facts.gpus.tools == ("nvidia-smi",) and facts.gpus.gpus == ()
