"""Build a throwaway fdl project: the ``ddp-bench`` workspace plus stub libtorch variants.

Layout produced under ``root``::

    Cargo.toml, Cargo.lock            workspace (member ddp-bench)
    ddp-bench/                        the crate (build.rs links -ltorch, no rpath)
    libtorch/<arch>/lib/libtorch.so   one stub per arch, e.g. precompiled/cu128
    docker-compose.yml                flodl's services (write_compose_file)

Each stub's ``fdl_torch_variant()`` returns its arch string, so the built
binary prints which libtorch the loader actually picked up. A stub is built
for this machine's CPU, or for another one with that CPU's C compiler
(:func:`add_variant`; aarch64 variants: :func:`rig.cross.add_aarch64_variant`).
An aarch64 host's variant needs a directory of its own (``precompiled/cu128-aarch64``):
the controller links each build against ``<controller.path>/libtorch/<arch>``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from fdl_tasks.core.binary_files import file_machine

__all__ = [
    "CROSS_SERVICE",
    "FIXTURE_DIR",
    "STUB_SOURCE",
    "VARIANT_MARKER",
    "add_nccl",
    "add_variant",
    "break_variant",
    "libtorch_dir",
    "make_project",
    "stub_compile_argv",
    "write_compose_file",
]

FIXTURE_DIR = Path(__file__).resolve().parent / "fixture"
STUB_SOURCE = FIXTURE_DIR / "stub_libtorch.c"
#: Next to each stub: the arch it was compiled for.
VARIANT_MARKER = ".fdl-variant"

# Not copied into a project: build outputs and the stub source (it is compiled
# into libtorch/<arch>/lib, not part of the cargo workspace).
_IGNORED = shutil.ignore_patterns("target", "stub_libtorch.c", "stub_hip.c", "__pycache__")


def _check_arch(arch: str) -> PurePosixPath:
    rel = PurePosixPath(arch)
    if not arch or rel.is_absolute() or ".." in rel.parts or "." in rel.parts:
        raise ValueError(f"arch must be a relative path like 'precompiled/cu128', got {arch!r}")
    return rel


def libtorch_dir(root: Path, arch: str) -> Path:
    """``root/libtorch/<arch>`` (the directory that contains ``lib/``)."""
    return Path(root) / "libtorch" / _check_arch(arch)


def _c_string_literal(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def stub_compile_argv(compiler: Sequence[str], output: Path, arch: str) -> list[str]:
    """``compiler`` (an argv prefix) building the stub for ``arch`` as ``output``."""
    return [
        *compiler,
        "-shared",
        "-fPIC",
        "-O2",
        f"-DFDL_VARIANT={_c_string_literal(arch)}",
        "-Wl,-soname,libtorch.so",
        "-o",
        str(output),
        str(STUB_SOURCE),
    ]


def _compile_stub(lib_file: Path, arch: str, compiler: Sequence[str]) -> None:
    tmp = lib_file.with_name(lib_file.name + ".tmp")
    cmd = stub_compile_argv(compiler, tmp, arch)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"compiling the libtorch stub for {arch!r} failed: {shlex.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    tmp.replace(lib_file)


def _stub_up_to_date(lib_dir: Path, arch: str, machine: str) -> bool:
    lib_file, marker = lib_dir / "libtorch.so", lib_dir / VARIANT_MARKER
    return (
        file_machine(lib_file) == machine
        and marker.is_file()
        and marker.read_text() == arch
        and lib_file.stat().st_mtime >= STUB_SOURCE.stat().st_mtime
    )


def add_variant(
    root: Path, arch: str, *, machine: str | None = None, compiler: Sequence[str] | None = None
) -> Path:
    """Compile the stub as ``root/libtorch/<arch>/lib/libtorch.so``; return the arch dir.

    ``machine``: the CPU it is for (``uname -m`` names; default this machine's),
    ``compiler``: the argv prefix of a C compiler for that CPU (default ``$CC``,
    else ``gcc``; see :func:`rig.cross.add_aarch64_variant`). ``lib/`` exists
    before it runs. Skipped when an up-to-date stub for exactly this arch and
    CPU is already there.
    """
    arch_dir = libtorch_dir(root, arch)
    lib_dir = arch_dir / "lib"
    if not _stub_up_to_date(lib_dir, arch, machine or os.uname().machine):
        lib_dir.mkdir(parents=True, exist_ok=True)
        _compile_stub(lib_dir / "libtorch.so", arch, compiler or [os.environ.get("CC", "gcc")])
        (lib_dir / VARIANT_MARKER).write_text(arch)
    return arch_dir


def add_nccl(root: Path, arch: str, version: str) -> Path:
    """An empty ``libnccl.so.<version>`` in the variant's ``lib`` (as precompiled libtorch
    ships NCCL): the probe reads the version from its name. Return the file."""
    nccl = libtorch_dir(root, arch) / "lib" / f"libnccl.so.{version}"
    nccl.parent.mkdir(parents=True, exist_ok=True)
    nccl.touch()
    return nccl


def break_variant(root: Path, arch: str) -> Path:
    """Remove ``root/libtorch/<arch>/lib`` (keeping the arch dir); return the arch dir."""
    arch_dir = libtorch_dir(root, arch)
    shutil.rmtree(arch_dir / "lib", ignore_errors=True)
    arch_dir.mkdir(parents=True, exist_ok=True)
    return arch_dir


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def make_project(
    root: Path, variants: Iterable[str], *, owner: tuple[int, int] | None = None
) -> Path:
    """Lay the fixture workspace into ``root`` and compile one stub per arch.

    Idempotent: existing files are overwritten with the fixture's, an
    existing ``target/`` under ``root`` is left alone, up-to-date stubs are
    not recompiled.  ``owner=(uid, gid)`` chowns the whole tree afterwards
    (root only), e.g. so a ``docker run --user uid:gid`` build can write
    ``target/`` inside it.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURE_DIR, root, ignore=_IGNORED, dirs_exist_ok=True)
    for arch in variants:
        add_variant(root, arch)
    if owner is not None:
        _chown_tree(root, *owner)
    return root


def _compose_service(
    image: str, libtorch_volume: str, *, own_toolchain: bool = False, **extra: object
) -> dict[str, object]:
    """A service like flodl's; the host's Rust toolchain mounted unless the image has its own."""
    from rig.docker_builder import toolchain_env, toolchain_mounts

    return {
        "image": image,
        "user": "${UID:-1000}:${GID:-1000}",
        "volumes": [
            ".:/workspace",
            f"{libtorch_volume}:/usr/local/libtorch:ro",
            *([] if own_toolchain else toolchain_mounts()),
        ],
        "working_dir": "/workspace",
        "environment": {
            "LIBTORCH_PATH": "/usr/local/libtorch",
            # Lets fault tests keep a build in flight (see the fixture's build.rs).
            "FDL_FIXTURE_BUILD_SLEEP": "${FDL_FIXTURE_BUILD_SLEEP:-0}",
            # flodl's launcher in this service reads the envelope (flodl forwards it too).
            "FLODL_INTERNAL_PREBUILD_PER_HOST": None,
            **({} if own_toolchain else toolchain_env()),
        },
        **extra,
    }


#: The compose service that cross-builds for aarch64 hosts (``controller.cross.aarch64.service``).
CROSS_SERVICE = "cuda-arm64"


def write_compose_file(root: Path, *, cross: bool = False) -> Path:
    """A ``docker-compose.yml`` shaped like flodl's: its ``dev`` and ``cuda`` services.

    Same image names (the rig tags its builder image ``flodl-cuda:<tag>`` and
    ``flodl-dev``), the same ``user``, workspace and libtorch mounts and the
    same variables (``CUDA_TAG``, ``LIBTORCH_HOST_PATH``, ``LIBTORCH_CPU_PATH``,
    ``UID``/``GID``). What differs: no ``build:`` (flodl's Dockerfiles need the
    network), no GPU reservation (no GPU here), cargo caches left out, and the
    host's Rust toolchain mounted read-only because the rig image has none.
    With ``cross``, also :data:`CROSS_SERVICE` for aarch64 hosts, shaped the
    same, in the rig's cross image (:data:`rig.cross.CROSS_REF`, which has its
    own toolchain).
    """
    import yaml

    from rig.cross import CROSS_REF

    host_libtorch = "${LIBTORCH_HOST_PATH:-./libtorch/precompiled/cu128}"
    services = {
        "dev": _compose_service("flodl-dev", "${LIBTORCH_CPU_PATH:-./libtorch/precompiled/cpu}"),
        "cuda": _compose_service(
            "flodl-cuda:${CUDA_TAG:-12.8}", host_libtorch, network_mode="host"
        ),
    }
    if cross:
        services[CROSS_SERVICE] = _compose_service(
            CROSS_REF, host_libtorch, own_toolchain=True, network_mode="host"
        )
    path = Path(root) / "docker-compose.yml"
    path.write_text(yaml.safe_dump({"services": services}, sort_keys=False), encoding="utf-8")
    return path
