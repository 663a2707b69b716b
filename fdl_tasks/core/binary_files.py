"""A built binary read on the controller: its digest, its CPU, the glibc it needs.

Read from the file alone, with no process run: the build step, the GPU gate
and verification all ask these of binaries and of libtorch itself.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import struct
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


#: ``SHT_GNU_verneed``: the section listing the symbol versions an ELF file needs.
_VERNEED = 0x6FFFFFFE


def required_glibc(binary: Path) -> tuple[int, int] | None:
    """The highest ``GLIBC_x.y`` symbol version the ELF file needs, if any."""
    try:
        with (
            binary.open("rb") as stream,
            mmap.mmap(stream.fileno(), 0, prot=mmap.PROT_READ) as data,
        ):
            names = needed_versions(data)
    except (OSError, ValueError) as exc:  # an empty file cannot be mapped: not ELF either
        raise FdlError(f"cannot read the ELF file {binary}: {exc}") from None
    versions = [m.groups() for name in names if (m := _GLIBC_SYMBOL.fullmatch(name))]
    return max(((int(major), int(minor)) for major, minor in versions), default=None)


def needed_versions(data: bytes | mmap.mmap) -> list[str]:
    """The symbol version names (``GLIBC_2.34``) an ELF image needs: its
    ``SHT_GNU_verneed`` sections' entries (32 or 64 bits, either byte order, as the
    LSB lays them out); :class:`ValueError` for what is not ELF, or is cut short."""
    if len(data) < 6 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    header, section = ("Q10xHH", "IIQQQQIIQQ") if wide else ("I10xHH", "I" * 10)
    try:
        shoff, shentsize, shnum = struct.unpack_from(order + header, data, 0x28 if wide else 0x20)
        sections = [
            struct.unpack_from(order + section, data, shoff + i * shentsize) for i in range(shnum)
        ]
        names = []
        for _, kind, _, _, offset, _, link, count, _, _ in sections:
            if kind != _VERNEED:
                continue
            strings = sections[link][4]
            for _ in range(count):  # Elf_Verneed entries, each with its Elf_Vernaux list
                _, aux_count, _, aux, following = struct.unpack_from(order + "HHIII", data, offset)
                at = offset + aux
                for _ in range(aux_count):
                    name, after = struct.unpack_from(order + "II", data, at + 8)
                    names.append(_string(data, strings + name))
                    if not after:  # the last one (a count that says more is not trusted)
                        break
                    at += after
                if not following:
                    break
                offset += following
        return names
    except (struct.error, IndexError, OverflowError) as exc:
        raise ValueError(f"a truncated or malformed ELF file ({exc})") from None


def _string(data: bytes | mmap.mmap, offset: int) -> str:
    """The NUL-terminated string at ``offset``."""
    end = data.find(b"\0", offset)
    if offset < 0 or end < 0:
        raise IndexError("a string outside the file")
    return bytes(data[offset:end]).decode("ascii", errors="replace")


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


def readable_facts(binary: Path) -> BinaryFacts | None:
    """:func:`binary_facts`, ``None`` for a file no ELF reader reads (verification reads it
    again, and says why)."""
    try:
        return binary_facts(binary)
    except (FdlError, OSError):
        return None


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
