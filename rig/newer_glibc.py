"""A libtorch variant built against a newer glibc than any rig host has.

A real one cannot be made here (this machine's glibc is the newest the rig
knows), so the stub ``libtorch.so`` is linked against a stand-in ``libc.so.6``
whose one symbol carries the version node ``GLIBC_2.99``: the stub's
``DT_VERNEED`` then names ``libc.so.6`` / ``GLIBC_2.99``, exactly what a
libtorch built on a newer distribution records. At run time the loader finds
the real libc, which lacks that version, and real ``ldd`` prints what it prints
on such a host: ``version `GLIBC_2.99' not found (required by …/libtorch.so)``.
The stand-in exists only in a temporary directory while linking.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from rig.project import libtorch_dir, stub_compile_argv

#: The version no glibc has.
NEWER = "GLIBC_2.99"
_SYMBOL = "fdl_rig_newer_glibc_symbol"


def _cc(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def add_newer_glibc_variant(root: Path, arch: str) -> Path:
    """``root/libtorch/<arch>/lib/libtorch.so`` needing ``GLIBC_2.99``; returns the arch dir."""
    arch_dir = libtorch_dir(root, arch)
    lib = arch_dir / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "libc.c").write_text(f"int {_SYMBOL}(void) {{ return 1; }}\n")
        (work / "libc.map").write_text(f"{NEWER} {{ global: {_SYMBOL}; local: *; }};\n")
        use = f"int {_SYMBOL}(void);\nint fdl_rig_use(void) {{ return {_SYMBOL}(); }}\n"
        (work / "use.c").write_text(use)
        _cc(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-nostdlib",
                "-Wl,-soname,libc.so.6",
                f"-Wl,--version-script,{work / 'libc.map'}",
                "-o",
                str(work / "libc.so"),
                str(work / "libc.c"),
            ]
        )
        tmp_lib = lib / "libtorch.so.tmp"
        _cc([*stub_compile_argv(["gcc"], tmp_lib, arch), str(work / "use.c"), f"-L{work}", "-lc"])
    tmp_lib.replace(lib / "libtorch.so")
    return arch_dir
