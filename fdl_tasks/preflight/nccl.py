"""NCCL version skew: which NCCL each host's variant brings, and when they disagree.

Pure logic. Hosts on different libtorch variants carry different NCCL builds,
and a DDP job across NCCL major.minor versions hangs or fails at the first
collective. The probe (:mod:`fdl_tasks.preflight.probe`) asks, in order of trust: the
``libnccl.so.X.Y.Z`` file in the variant's ``lib`` (precompiled libtorch ships
one), the ``nccl.h`` in its ``include`` (a build that linked NCCL statically),
and the host's own library from ``ldconfig -p`` (a variant that has neither).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.variants import libtorch_dir, variant_lib
from fdl_tasks.gpu.auto_arch import AUTO
from fdl_tasks.gpu.gpus import vendor_of

#: The answers' keys: a file name in the variant's lib, a header line, a system library path.
LIB_KEY, HEADER_KEY, SYSTEM_KEY = "nccl_lib", "nccl_h", "nccl_sys"

_FILE = re.compile(r"(?:^|/)libnccl\.so\.(\d+)\.(\d+)(?:\.(\d+))?$")
_DEFINE = re.compile(r"#\s*define\s+NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)\b")
_GREP_DEFINES = "^#[[:space:]]*define[[:space:]]+NCCL_(MAJOR|MINOR|PATCH)[[:space:]]"


@attrs.frozen
class NcclVersion:
    """A host's NCCL; ``patch`` is ``None`` where only major.minor was found."""

    major: int
    minor: int
    patch: int | None = None

    def __str__(self) -> str:
        patch = "" if self.patch is None else f".{self.patch}"
        return f"{self.major}.{self.minor}{patch}"


def _from_files(names: Iterable[str]) -> NcclVersion | None:
    """The first ``libnccl.so.X.Y[.Z]`` (a bare ``libnccl.so.2`` names no minor)."""
    for name in names:
        if match := _FILE.search(name.strip()):
            major, minor, patch = match.groups()
            return NcclVersion(int(major), int(minor), None if patch is None else int(patch))
    return None


def _from_header(lines: Iterable[str]) -> NcclVersion | None:
    """``#define NCCL_MAJOR 2`` … from ``nccl.h``; ``None`` without major and minor."""
    found: dict[str, int] = {}
    for line in lines:
        if match := _DEFINE.search(line):
            found.setdefault(match.group(1), int(match.group(2)))
    if "MAJOR" not in found or "MINOR" not in found:
        return None
    return NcclVersion(found["MAJOR"], found["MINOR"], found.get("PATCH"))


def parse_nccl(
    lib_files: Iterable[str], header_lines: Iterable[str], system_paths: Iterable[str]
) -> NcclVersion | None:
    """The host's NCCL: the variant's library file, else its header, else the system's."""
    return _from_files(lib_files) or _from_header(header_lines) or _from_files(system_paths)


@attrs.frozen
class NcclSources:
    """Where a host's NCCL is read: its variant's ``lib`` and ``include/nccl.h``."""

    lib: str
    header: str

    @classmethod
    def for_worker(cls, worker: Worker) -> NcclSources | None:
        """``None`` where NCCL does not apply (CPU and AMD variants) or the variant is
        not known yet (no arch, or ``auto``)."""
        arch = worker.arch
        if arch is None or arch == AUTO or vendor_of(arch, worker.features) != "nvidia":
            return None
        return cls(
            variant_lib(worker.path, arch), f"{libtorch_dir(worker.path, arch)}/include/nccl.h"
        )

    def lines(self) -> list[str]:
        """POSIX sh: the names of the variant's ``libnccl.so.*`` files and of the
        ``ldconfig -p`` entries for libnccl, each resolved to its real file (a
        ``libnccl.so.2`` link names no minor); the header's version lines. Names only:
        a directory's own name could break an answer's line."""
        header = shlex.quote(self.header)
        system = "sed -n 's/.*libnccl\\.so.* => //p'"
        return [
            f"for f in {shlex.quote(self.lib)}/libnccl.so.*; do "
            '[ -e "$f" ] || continue; r=$(readlink -f "$f" 2>/dev/null); '
            f'printf \'{LIB_KEY}=%s\\n\' "${{f##*/}}" "${{r##*/}}"; done',
            f"[ -r {header} ] && grep -E {shlex.quote(_GREP_DEFINES)} {header} | "
            f"sed 's/^/{HEADER_KEY}=/'",
            f'(PATH="$PATH:/sbin:/usr/sbin"; ldconfig -p) 2>/dev/null | {system} | '
            "while IFS= read -r p; do "
            'r=$(readlink -f "$p" 2>/dev/null || echo "$p"); '
            f"printf '{SYSTEM_KEY}=%s\\n' \"${{r##*/}}\"; done",
        ]


def nccl_skew(versions: Mapping[str, NcclVersion | None]) -> str | None:
    """The one line when hosts (in order) disagree on NCCL major.minor; hosts whose NCCL
    is unknown (or who have none) are left out."""
    groups: dict[tuple[int, int], list[str]] = {}
    for host, version in versions.items():
        if version is not None:
            groups.setdefault((version.major, version.minor), []).append(host)
    if len(groups) < 2:
        return None
    listed = ", ".join(
        f"{major}.{minor} ({', '.join(hosts)})" for (major, minor), hosts in sorted(groups.items())
    )
    return (
        f"NCCL differs across hosts: {listed}: a DDP job across them hangs or fails at the "
        "first collective; give them variants with the same NCCL major.minor"
    )
