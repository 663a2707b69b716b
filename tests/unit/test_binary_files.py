"""The ELF reader behind every binary's glibc need, against pyelftools as the oracle.

Real files of this machine (x86_64, and the aarch64 cross libraries the rig
installs), ELF images built here in each class and byte order, and files cut
short or scrambled: whatever the bytes, the answer is a list or a ValueError.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from hypothesis import given, settings
from hypothesis import strategies as st

from fdl_tasks.core.binary_files import needed_versions, required_glibc
from fdl_tasks.core.errors import FdlError

REAL = [
    Path(p)
    for p in (
        "/bin/ls",
        "/bin/true",
        "/usr/bin/ssh",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/aarch64-linux-gnu/lib/libc.so.6",
        "/usr/aarch64-linux-gnu/lib/libstdc++.so.6",
    )
    if Path(p).is_file()
]


def oracle(path: Path) -> list[str]:
    with path.open("rb") as stream:
        return [
            aux.name
            for section in ELFFile(stream).iter_sections()
            if isinstance(section, GNUVerNeedSection)
            for _, auxiliaries in section.iter_versions()
            for aux in auxiliaries
        ]


@pytest.mark.parametrize("path", REAL, ids=str)
def test_the_versions_a_real_file_needs_are_pyelftools_own(path: Path) -> None:
    names = needed_versions(path.read_bytes())
    assert names == oracle(path) and any(n.startswith("GLIBC_") for n in names)


def elf_image(wide: bool, order: str, needs: dict[str, list[str]]) -> bytes:
    """An ELF file with a string table and one SHT_GNU_verneed section listing ``needs``
    (file → version names), laid out as the gABI and the LSB say."""
    strings = b"\0"

    def text(name: str) -> int:
        nonlocal strings
        at = len(strings)
        strings += name.encode() + b"\0"
        return at

    verneed = b""
    for i, (file, names) in enumerate(needs.items()):
        last = i == len(needs) - 1
        size = 16 + 16 * len(names)
        verneed += struct.pack(order + "HHIII", 1, len(names), text(file), 16, 0 if last else size)
        for j, name in enumerate(names):
            after = 0 if j == len(names) - 1 else 16
            verneed += struct.pack(order + "IHHII", 0, 0, 2 + j, text(name), after)
    header_size = 64 if wide else 52
    strings_at = header_size
    verneed_at = strings_at + len(strings)
    shoff = verneed_at + len(verneed)
    layout = order + ("IIQQQQIIQQ" if wide else "I" * 10)
    entry = struct.calcsize(layout)
    sections = [
        struct.pack(layout, *[0] * 10),
        struct.pack(layout, 0, 3, 0, 0, strings_at, len(strings), 0, 0, 1, 0),
        struct.pack(layout, 0, 0x6FFFFFFE, 0, 0, verneed_at, len(verneed), 1, len(needs), 4, 0),
    ]
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if order == "<" else 2, 1]) + bytes(9)
    if wide:
        rest = struct.pack(order + "HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, entry, 3, 1)
    else:
        rest = struct.pack(order + "HHIIIIIHHHHHH", 3, 3, 1, 0, 0, shoff, 0, 52, 0, 0, entry, 3, 1)
    return ident + rest + strings + verneed + b"".join(sections)


@pytest.mark.parametrize("wide", [True, False], ids=["64-bit", "32-bit"])
@pytest.mark.parametrize("order", ["<", ">"], ids=["little-endian", "big-endian"])
def test_each_class_and_byte_order_is_read(wide: bool, order: str, tmp_path: Path) -> None:
    needs = {"libc.so.6": ["GLIBC_2.17", "GLIBC_2.34"], "libgcc_s.so.1": ["GCC_3.0"]}
    image = elf_image(wide, order, needs)
    assert needed_versions(image) == ["GLIBC_2.17", "GLIBC_2.34", "GCC_3.0"]
    binary = tmp_path / "built"
    binary.write_bytes(image)
    assert required_glibc(binary) == (2, 34)
    if wide and order == "<":  # the layout itself, as pyelftools reads it
        assert oracle(binary) == ["GLIBC_2.17", "GLIBC_2.34", "GCC_3.0"]


def test_a_file_needing_no_glibc_version_needs_none(tmp_path: Path) -> None:
    binary = tmp_path / "static"
    binary.write_bytes(elf_image(True, "<", {}))
    assert required_glibc(binary) is None


@pytest.mark.parametrize("cut", [0, 3, 5, 16, 40, 63, -200, -1])
def test_a_file_cut_short_is_a_clear_error(cut: int, tmp_path: Path) -> None:
    whole = elf_image(True, "<", {"libc.so.6": ["GLIBC_2.34"]})
    binary = tmp_path / "cut"
    binary.write_bytes(whole[:cut])
    with pytest.raises(FdlError, match=f"cannot read the ELF file {binary}"):
        required_glibc(binary)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=8))
def test_scrambled_bytes_give_a_list_or_a_value_error(changes: list[tuple[int, int]]) -> None:
    image = bytearray(elf_image(True, "<", {"libc.so.6": ["GLIBC_2.17", "GLIBC_2.34"]}))
    for at, value in changes:
        image[at % len(image)] = value
    try:
        names = needed_versions(bytes(image))
    except ValueError:
        return
    assert all(isinstance(n, str) for n in names)
