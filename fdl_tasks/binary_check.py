"""Delivery verification: does each remote really see a runnable copy of the binary?

Pure logic plus one ELF reader. The script runs on each host in that host's
own view of the paths; the verdict compares its answers with the binary on
the controller.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path

import attrs

from fdl_tasks.envelope import PerHostEnvelope
from fdl_tasks.errors import FdlError
from fdl_tasks.names import join_path
from fdl_tasks.probe import BEGIN, END, HOST_FACT_LINES, glibc_version, marked_answers
from fdl_tasks.unmet_versions import UNMET_KEY, UNMET_SED, UnmetVersion, parse_unmet, unmet_text

_GLIBC_SYMBOL = re.compile(r"GLIBC_(\d+)\.(\d+)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def required_glibc(binary: Path) -> tuple[int, int] | None:
    """The highest ``GLIBC_x.y`` symbol version the ELF file needs, if any."""
    from elftools.common.exceptions import ELFError  # only prebuild needs it: keep inv fast
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    try:
        with binary.open("rb") as stream:
            versions = [
                (int(m.group(1)), int(m.group(2)))
                for section in ELFFile(stream).iter_sections()
                if isinstance(section, GNUVerNeedSection)
                for _, auxiliaries in section.iter_versions()
                for aux in auxiliaries
                if (m := _GLIBC_SYMBOL.fullmatch(aux.name))
            ]
    except (OSError, ELFError) as exc:
        raise FdlError(f"cannot read the ELF file {binary}: {exc}") from None
    return max(versions, default=None)


def verification_script(worker_path: str, entry: PerHostEnvelope) -> str:
    """Hash the binary, read its ELF header, list unresolved libraries, report the host's
    libc and CPU architecture: one round trip, in the host's own view of the paths."""
    binary = shlex.quote(join_path(worker_path, entry.bin))
    library_path = shlex.quote(entry.ld_library_path)
    return "\n".join(
        [
            f"echo {BEGIN}",
            f"if [ -f {binary} ]; then echo \"sha256=$(sha256sum {binary} | cut -d' ' -f1)\"; "
            "else echo sha256=missing; fi",
            f"LD_LIBRARY_PATH={library_path} ldd {binary} 2>&1 | "
            "sed -n -e 's/^[[:space:]]*\\([^[:space:]]*\\) => not found.*/missing_lib=\\1/p' "
            f"-e {shlex.quote(UNMET_SED)}",
            *HOST_FACT_LINES,
            f"[ -f {binary} ] && printf 'elf=%s\\n' "
            f"\"$(od -An -tu1 -N20 {binary} | tr -s ' \\n' ' ')\"",
            f"echo {END}",
            "exit 0",
        ]
    )


#: ELF ``e_machine`` values and the ``uname -m`` names of their CPU architectures.
ELF_MACHINES = {62: "x86_64", 183: "aarch64", 21: "ppc64le", 243: "riscv64", 40: "armv7l"}


def elf_machine(header: str) -> str | None:
    """The CPU architecture an ELF header (its first 20 bytes, as decimal numbers) is for.

    ``None`` for something that is not an ELF file; the number itself for an
    architecture this table does not name.
    """
    data = [int(b) for b in header.split() if b.isdigit()]
    if len(data) < 20 or data[:4] != [127, 69, 76, 70]:
        return None
    low, high = (data[18], data[19]) if data[5] == 1 else (data[19], data[18])
    number = low | high << 8
    return ELF_MACHINES.get(number, f"ELF machine {number}")


def file_machine(path: Path) -> str | None:
    """:func:`elf_machine` of a file on this machine; ``None`` when it cannot be read."""
    try:
        with path.open("rb") as stream:
            head = stream.read(20)
    except OSError:
        return None
    return elf_machine(" ".join(str(byte) for byte in head))


@attrs.frozen
class RemoteCopy:
    """What a host reported about its copy of the binary."""

    sha256: str | None
    missing_libraries: tuple[str, ...]
    glibc: tuple[int, int] | None = None
    cpu_arch: str | None = None  # the host's ``uname -m``
    binary_cpu_arch: str | None = None  # what the copy's ELF header says it is for
    #: Versions the binary or a library it loads needs that the host's libraries lack.
    unmet: tuple[UnmetVersion, ...] = ()


def parse_verification(stdout: str) -> RemoteCopy | None:
    answers = marked_answers(stdout)
    if answers is None:
        return None
    sha = answers.get("sha256")
    return RemoteCopy(
        sha256=None if sha in (None, "missing") else sha,
        missing_libraries=answers.every("missing_lib"),
        glibc=glibc_version(answers.get("libc")),
        cpu_arch=answers.get("cpu_arch") or None,
        binary_cpu_arch=elf_machine(answers.get("elf") or ""),
        unmet=parse_unmet(answers.every(UNMET_KEY)),
    )


def delivery_problems(
    host: str, path: str, copy: RemoteCopy, expected_sha: str, needed_glibc: tuple[int, int] | None
) -> list[str]:
    """Every reason this host cannot run the binary the controller built."""
    problems = []
    if copy.sha256 is None:
        problems.append(f"{host}: {path} does not exist in this host's view of the mount")
    elif copy.sha256 != expected_sha:
        problems.append(
            f"{host}: {path} differs from the controller's build (remote sha256 "
            f"{copy.sha256[:16]}…, controller {expected_sha[:16]}…): stale or "
            "lagging shared mount"
        )
    if copy.cpu_arch and copy.binary_cpu_arch and copy.cpu_arch != copy.binary_cpu_arch:
        problems.append(
            f"{host}: {path} is a {copy.binary_cpu_arch} binary but the host is {copy.cpu_arch}: "
            "it cannot run there"
        )
    if copy.missing_libraries:
        problems.append(
            f"{host}: libraries not found with the envelope's LD_LIBRARY_PATH: "
            + ", ".join(copy.missing_libraries)
        )
    if copy.unmet:
        problems.append(
            f"{host}: versions not found with the envelope's LD_LIBRARY_PATH: "
            f"{unmet_text(copy.unmet)}"
        )
    remote_glibc = copy.glibc
    if needed_glibc and remote_glibc and remote_glibc < needed_glibc:
        problems.append(
            f"{host}: the binary needs glibc {needed_glibc[0]}.{needed_glibc[1]} "
            f"but the host has {remote_glibc[0]}.{remote_glibc[1]}"
        )
    return problems
