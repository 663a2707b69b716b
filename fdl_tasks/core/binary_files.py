"""A built binary read on the controller: its digest, its CPU, the glibc it needs.

Read from the file alone, with no process run: the build step, the GPU gate
and verification all ask these of binaries and of libtorch itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import attrs

from fdl_tasks.core.errors import FdlError

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


@attrs.frozen
class BinaryFacts:
    """What verification compares each host's copy with: the built binary's sha256 and the
    newest glibc it needs (``None``: none). A build record keeps them, so that a run that
    finds the binary unchanged reads it no more."""

    sha256: str
    glibc: tuple[int, int] | None

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "glibc": list(self.glibc) if self.glibc else None}

    @classmethod
    def from_json(cls, data: Any) -> BinaryFacts:
        """:class:`ValueError` when ``data`` is not what :meth:`to_json` wrote."""
        try:
            sha256, glibc = data["sha256"], data["glibc"]
        except (KeyError, TypeError) as exc:
            raise ValueError("binary facts") from exc
        if not isinstance(sha256, str) or not (glibc is None or _version(glibc)):
            raise ValueError("binary facts")
        return cls(sha256, (glibc[0], glibc[1]) if glibc else None)


def _version(data: Any) -> bool:
    return isinstance(data, list) and len(data) == 2 and all(type(n) is int for n in data)


def binary_facts(binary: Path) -> BinaryFacts:
    """:class:`FdlError` when the file cannot be read as ELF; :class:`OSError` when at all."""
    return BinaryFacts(file_sha256(binary), required_glibc(binary))


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
