"""An AMD host's libraries on the rig: a system ROCm runtime and stub ROCm variants.

libtorch-rocm bundles the user-space ROCm stack; on a host whose kernel driver
does not match that bundle, the process dies at its first GPU operation unless
the system runtime (``/opt/rocm/lib``) comes first on ``LD_LIBRARY_PATH``. The
rig reproduces exactly that, so the order is tested by running the binary:

- :func:`install_system_rocm` compiles ``rig/fixture/stub_hip.c`` as
  ``/opt/rocm/lib/libamdhip64.so`` (the good runtime; this machine's path, which
  every rig host shares, as an AMD host's own ``/opt/rocm``);
- :func:`add_rocm_variant` compiles the variant's bundled ``libamdhip64.so``
  (which kills the process when it is loaded) next to a stub ``libtorch.so``
  that needs it, and writes the variant's ``.arch``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rig.project import FIXTURE_DIR, libtorch_dir, stub_compile_argv

HIP_SOURCE = FIXTURE_DIR / "stub_hip.c"
SYSTEM_ROCM_LIB = Path("/opt/rocm/lib")
#: What the rig's ROCm variants cover, as flodl's ``.arch`` spells it.
ROCM_ARCHS = "gfx900 gfx906 gfx90a gfx1030 gfx1100"


def _cc(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def _hip(output: Path, *, bundled: bool) -> None:
    flags = ["-DFDL_HIP_BUNDLED"] if bundled else []
    tmp = output.with_name(output.name + ".tmp")
    _cc(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            *flags,
            "-Wl,-soname,libamdhip64.so",
            "-o",
            str(tmp),
            str(HIP_SOURCE),
        ]
    )
    tmp.replace(output)


def install_system_rocm() -> Path:
    """``/opt/rocm/lib/libamdhip64.so``, the host's own (good) runtime."""
    SYSTEM_ROCM_LIB.mkdir(parents=True, exist_ok=True)
    _hip(SYSTEM_ROCM_LIB / "libamdhip64.so", bundled=False)
    return SYSTEM_ROCM_LIB


def add_rocm_variant(root: Path, arch: str, archs: str = ROCM_ARCHS) -> Path:
    """``root/libtorch/<arch>``: ``lib/libamdhip64.so`` (the bundled copy), ``lib/libtorch.so``
    needing it, and ``.arch``; returns the arch dir."""
    arch_dir = libtorch_dir(root, arch)
    lib = arch_dir / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    _hip(lib / "libamdhip64.so", bundled=True)
    torch = lib / "libtorch.so"
    argv = stub_compile_argv(["gcc"], torch.with_name("libtorch.so.tmp"), arch)
    _cc([*argv, f"-L{lib}", "-Wl,--no-as-needed", "-lamdhip64"])
    torch.with_name("libtorch.so.tmp").replace(torch)
    (arch_dir / ".arch").write_text(f"torch=2.5.1\ncuda=none\narchs={archs}\nsource=stock\n")
    return arch_dir


def write_arch_file(root: Path, arch: str, cuda: str, archs: str) -> Path:
    """flodl's ``.arch`` for a (stub) CUDA variant."""
    path = libtorch_dir(root, arch) / ".arch"
    path.write_text(f"torch=2.7.0\ncuda={cuda}\narchs={archs}\nsource=stock\n")
    return path
