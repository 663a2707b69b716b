"""Cross builds' defaults: the Rust target and GNU linker of each CPU, and cargo's variables.

Pure.
"""

from __future__ import annotations

#: Rust targets and GNU cross compilers by ``uname -m`` machine (Debian's names).
GNU_TARGETS = {
    "x86_64": ("x86_64-unknown-linux-gnu", "x86_64-linux-gnu-gcc"),
    "aarch64": ("aarch64-unknown-linux-gnu", "aarch64-linux-gnu-gcc"),
    "ppc64le": ("powerpc64le-unknown-linux-gnu", "powerpc64le-linux-gnu-gcc"),
    "riscv64": ("riscv64gc-unknown-linux-gnu", "riscv64-linux-gnu-gcc"),
    "armv7l": ("armv7-unknown-linux-gnueabihf", "arm-linux-gnueabihf-gcc"),
}


def cross_env(target: str, linker: str) -> dict[str, str]:
    """cargo's linker for ``target`` and, for build scripts that compile C/C++ (the ``cc``
    crate), the matching compilers: ``CARGO_TARGET_<T>_LINKER``, ``CC_<t>``, ``CXX_<t>``."""
    snake = target.replace("-", "_")
    environment = {f"CARGO_TARGET_{snake.upper()}_LINKER": linker}
    if linker.endswith("gcc"):
        environment |= {f"CC_{snake}": linker, f"CXX_{snake}": linker[: -len("gcc")] + "g++"}
    return environment
