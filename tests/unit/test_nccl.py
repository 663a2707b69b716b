"""NCCL in preflight: each host's version read from its variant, one line when hosts
disagree on major.minor."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import attrs
import pytest

from fdl_tasks.config.model import Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.preflight.nccl import NcclSources, NcclVersion, nccl_skew, parse_nccl
from fdl_tasks.preflight.probe import HostVerdict, ProbeFacts, ProbeRequest, parse_facts

WORKER = Worker("gpu1", "/mnt/p", "precompiled/cu128")
#: nccl.h as NVIDIA ships it (the lines around the version defines included).
HEADER = """\
#ifndef NCCL_H_
#define NCCL_H_
#include <cuda_runtime.h>
#define NCCL_MAJOR 2
#define NCCL_MINOR 26
#define NCCL_PATCH 2
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22602
#define NCCL_VERSION(X,Y,Z) ((X) * 10000 + (Y) * 100 + (Z))
"""
#: ``ldconfig -p`` on an Ubuntu host with NVIDIA's libnccl2 package.
LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibncursesw.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libncursesw.so.6
\tlibnccl.so.2 (libc6,x86-64) => {lib}/libnccl.so.2
\tlibnccl.so (libc6,x86-64) => {lib}/libnccl.so
"""


def v(text: str) -> NcclVersion:
    parts = [int(p) for p in text.split(".")]
    return NcclVersion(parts[0], parts[1], parts[2] if len(parts) > 2 else None)


@pytest.mark.parametrize(
    ("files", "header", "system", "expected"),
    [
        (["libnccl.so.2", "libnccl.so.2.21.5"], [], [], "2.21.5"),
        ([], HEADER.splitlines(), [], "2.26.2"),
        (["libnccl.so.2.21.5"], HEADER.splitlines(), ["/usr/lib/libnccl.so.2.19.3"], "2.21.5"),
        (["libnccl.so.2"], HEADER.splitlines(), ["/usr/lib/libnccl.so.2.19.3"], "2.26.2"),
        ([], [], ["/usr/lib/x86_64-linux-gnu/libnccl.so.2.19.3"], "2.19.3"),
        ([], ["#define NCCL_MAJOR 2"], ["/usr/lib/libnccl.so.2"], None),
        ([], [], [], None),
    ],
)
def test_parse_nccl_trusts_the_file_then_the_header_then_the_system(
    files: list[str], header: list[str], system: list[str], expected: str | None
) -> None:
    found = parse_nccl(files, header, system)
    assert (str(found) if found else None) == expected


def test_the_probe_reads_the_variant_then_the_system_on_a_real_shell(tmp_path: Path) -> None:
    """The probe's own lines on this machine: a variant with a quoted-hostile path, and
    a fake ``ldconfig`` whose entries are symlinks resolved to the real file name."""
    root = tmp_path / "a dir; touch pwned $(id)"
    worker = Worker("gpu1", str(root), "precompiled/cu128")
    lib, include = (
        root / "libtorch/precompiled/cu128/lib",
        root / "libtorch/precompiled/cu128/include",
    )
    lib.mkdir(parents=True)
    system, bin_dir = tmp_path / "system", tmp_path / "bin"
    system.mkdir()
    bin_dir.mkdir()
    (system / "libnccl.so.2.19.3").touch()
    (system / "libnccl.so.2").symlink_to("libnccl.so.2.19.3")
    ldconfig = bin_dir / "ldconfig"
    ldconfig.write_text(f"#!/bin/sh\ncat <<'EOF'\n{LDCONFIG.format(lib=system)}EOF\n")
    ldconfig.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def probed() -> str | None:
        script = ProbeRequest.for_host(worker, abi=True).script()
        done = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
        )
        facts = parse_facts(done.stdout)
        assert facts is not None
        return str(facts.nccl) if facts.nccl else None

    assert probed() == "2.19.3"  # the variant has none: the host's own
    include.mkdir()
    (include / "nccl.h").write_text(HEADER)
    assert probed() == "2.26.2"
    (lib / "libnccl.so.2.21.5").touch()
    assert probed() == "2.21.5"
    (lib / "libnccl.so.2.21.5").unlink()
    (system / "libnccl.so.2.24.3").touch()
    (lib / "libnccl.so.2").symlink_to(system / "libnccl.so.2.24.3")  # a link: its target's
    assert probed() == "2.24.3"
    assert not list(tmp_path.rglob("pwned")) and not (Path.cwd() / "pwned").exists()


def test_nccl_is_asked_only_of_a_known_nvidia_variant_when_prebuilding() -> None:
    assert ProbeRequest.for_host(WORKER, abi=True).nccl == NcclSources(
        "/mnt/p/libtorch/precompiled/cu128/lib", "/mnt/p/libtorch/precompiled/cu128/include/nccl.h"
    )
    assert "libnccl" not in ProbeRequest.for_host(WORKER, abi=False).script()
    for arch in (None, "auto", "precompiled/cpu", "precompiled/rocm6.2"):
        other = attrs.evolve(WORKER, arch=arch)
        assert "libnccl" not in ProbeRequest.for_host(other, abi=True).script(), arch
    cpu_features = attrs.evolve(WORKER, features=())
    assert ProbeRequest.for_host(cpu_features, abi=True).nccl is None


def test_hosts_disagreeing_on_major_minor_get_one_line_naming_them() -> None:
    line = nccl_skew(
        {"node-c": v("2.26.2"), "node-a": v("2.21.5"), "cpu": None, "node-b": v("2.21.1")}
    )
    assert line == (
        "NCCL differs across hosts: 2.21 (node-a, node-b), 2.26 (node-c): a DDP job across "
        "them hangs or fails at the first collective; give them variants with the same NCCL "
        "major.minor"
    )


@pytest.mark.parametrize(
    "versions",
    [
        {"a": v("2.21.5"), "b": v("2.21.3")},  # a patch apart: compatible
        {"a": v("2.21.5"), "b": None, "c": None},  # the others unknown: nothing to compare
        {"a": None, "b": None},
        {},
    ],
)
def test_no_line_while_the_known_hosts_agree(versions: dict[str, NcclVersion | None]) -> None:
    assert nccl_skew(versions) is None


def test_json_carries_each_hosts_nccl() -> None:
    facts = ProbeFacts("ok", nccl=v("2.21.5"))
    assert HostVerdict("a", "ok", facts=facts).to_json()["nccl"] == "2.21.5"
    assert HostVerdict("b", "ok", facts=ProbeFacts("ok")).to_json()["nccl"] is None
    assert HostVerdict("c", "warning").to_json()["nccl"] is None


def test_the_mismatch_setting_is_warn_or_error() -> None:
    assert Settings().nccl_mismatch == "warn"
    assert Settings.from_config({"nccl_mismatch": "ERROR"}).nccl_mismatch == "error"
    with pytest.raises(FdlError, match="nccl_mismatch must be error or warn"):
        Settings.from_config({"nccl_mismatch": "fail"})
