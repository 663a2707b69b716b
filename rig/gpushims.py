"""Simulated GPU tools for rig hosts: ``nvidia-smi`` and ``rocminfo`` shims.

No GPU exists here, so a host with ``HostSpec.gpus`` set gets shims that print
what the real tools printed on real machines: the captures in
``tests/data/gpus`` (its README says where each came from). The shims answer
only the queries fdl-tasks' probe makes; anything else is an error (exit 2),
so a probe asking something new fails loudly instead of reading a made-up answer.
"""

from __future__ import annotations

import shlex
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpus"
QUERY_CAP = "--query-gpu=index,name,compute_cap,driver_version --format=csv,noheader"
QUERY_NOCAP = "--query-gpu=index,name,driver_version --format=csv,noheader"

#: Profile name -> (nvidia-smi capture with compute_cap, without it, rocminfo capture).
#: A driver older than ``compute_cap`` has no first capture: that query fails as theirs does.
PROFILES: dict[str, tuple[str | None, str | None, str | None]] = {
    "blackwell": ("nvidia-smi-blackwell.csv", None, None),
    "pascal": ("nvidia-smi-pascal.csv", None, None),
    "a6000x2": ("nvidia-smi-a6000x2.csv", None, None),
    "t4-470": (None, "nvidia-smi-t4-470-nocap.csv", None),
    "mi25x2": (None, None, "rocminfo-mi25x2.txt"),
    "mixed": ("nvidia-smi-blackwell.csv", None, "rocminfo-mi25x2.txt"),
}


def _print(name: str) -> str:
    return f"printf '%s' {shlex.quote((DATA / name).read_text())}"


def _nvidia_smi(host: str, cap: str | None, nocap: str | None) -> str:
    with_cap = _print(cap) if cap else f"{_print('nvidia-smi-470-compute_cap.err')} >&2; exit 2"
    without = _print(nocap) if nocap else _print(cap or "")
    return "\n".join(
        [
            "#!/bin/sh",
            f"# rig.gpushims nvidia-smi for host {host}",
            'case "$*" in',
            f"  {shlex.quote(QUERY_CAP)}) {with_cap}; exit 0 ;;",
            f"  {shlex.quote(QUERY_NOCAP)}) {without}; exit 0 ;;",
            "esac",
            'echo "rig shim: nvidia-smi $* is not simulated" >&2',
            "exit 2",
            "",
        ]
    )


def _rocminfo(host: str, capture: str) -> str:
    return "\n".join(
        ["#!/bin/sh", f"# rig.gpushims rocminfo for host {host}", _print(capture), "exit 0", ""]
    )


def gpu_shims(host: str, profile: str | None) -> dict[str, str]:
    """Command name -> shim script for ``profile`` (nothing for ``None``)."""
    if profile is None:
        return {}
    if profile not in PROFILES:
        raise ValueError(f"unknown GPU profile {profile!r}: one of {sorted(PROFILES)}")
    cap, nocap, rocm = PROFILES[profile]
    shims = {}
    if cap or nocap:
        shims["nvidia-smi"] = _nvidia_smi(host, cap, nocap)
    if rocm:
        shims["rocminfo"] = _rocminfo(host, rocm)
    return shims
