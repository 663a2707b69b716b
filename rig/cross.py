"""aarch64 hosts for the test rig: qemu binfmt, cross toolchains, aarch64 stubs.

Four pieces, each idempotent (``python3 -m rig.cross ensure`` does the first three,
and only checks on a second run):

* **Running aarch64 binaries on this x86_64 machine.**  :func:`ensure_host_packages`
  installs ``qemu-user-static`` and the arm64 runtime (``libc6-arm64-cross``,
  ``libgcc-s1-arm64-cross``: every Rust binary needs ``libgcc_s.so.1``);
  :func:`ensure_binfmt` mounts ``binfmt_misc`` and registers
  ``/usr/lib/binfmt.d/qemu-aarch64.conf``.  An aarch64 ELF file then starts
  directly, as long as ``QEMU_LD_PREFIX`` (:data:`AARCH64_SYSROOT`) tells qemu
  where the aarch64 ``/lib`` is.  An emulated rig host
  (``HostSpec(emulate="aarch64")`` in :mod:`rig.sshrig`) is built on this.
* **Native cross builds on the controller** (:func:`ensure_native_cross`):
  ``gcc-aarch64-linux-gnu`` with ``libc6-dev-arm64-cross`` (crt files, libc),
  and the aarch64 std of Debian's ``rustc-web`` (``libstd-rust-web-dev:arm64``,
  the same version as the amd64 ``rustc-web`` that ``scripts/setup`` installs).
  The last is a foreign-architecture package, so dpkg learns arm64 first
  (``dpkg --add-architecture arm64``, once: from then on ``apt-get update`` also
  fetches bookworm's arm64 package lists, about 9 MB).
  ``/usr/bin/rustc --target aarch64-unknown-linux-gnu`` then works offline,
  which a rustup toolchain cannot (``rustup target add`` needs the network).
* **A cross builder image** :data:`CROSS_REF` (:func:`ensure_cross_image`):
  Debian trixie ``minbase`` by ``debootstrap`` from this machine's mirror, then,
  chrooted, ``dpkg --add-architecture arm64`` and ``apt-get install`` of rustc
  and cargo (1.85), ``libstd-rust-dev:arm64``, ``gcc-aarch64-linux-gnu`` and the
  native gcc (for build scripts); ``debootstrap --include`` cannot pull
  foreign-arch packages, hence the chrooted apt.  The rootfs tarball is cached
  under :data:`~rig.docker_builder.CACHE_DIR` like the bookworm builder's.  The
  image has its own toolchain and bakes the aarch64 linker, so
  ``cargo build --target aarch64-unknown-linux-gnu`` needs nothing else; its
  entrypoint puts that toolchain first whatever ``PATH`` a build passes (a
  cluster's ``controller.docker.run_args`` and ``env`` reach cross builds too,
  and the rig's bring the host's rustup toolchain, which has no aarch64 std).
* **aarch64 stub libtorch variants**: :func:`add_aarch64_variant` compiles
  ``rig/fixture/stub_libtorch.c`` with ``aarch64-linux-gnu-gcc`` in the image.

``python3 -m rig.cross selftest`` proves the whole path on the fixture: stub,
the cross build exactly as prebuild renders it, the binary run under qemu with
and without its ``LD_LIBRARY_PATH``, and the aarch64 loader's ldd-style trace
(what the emulated host's ``ldd``, ``rig/templates/ldd-aarch64.sh``, prints).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rig.docker_builder import (
    CACHE_DIR,
    DEFAULT_MIRROR,
    SYSTEM_PATH,
    apt_mirror,
    ensure_dockerd,
    image_exists,
    run_logged,
)
from rig.project import FIXTURE_DIR, add_variant, libtorch_dir, make_project

__all__ = [
    "AARCH64_LOADER",
    "AARCH64_SYSROOT",
    "CROSS_IMAGE",
    "CROSS_LINKER",
    "CROSS_REF",
    "HOST_PACKAGES",
    "NATIVE_CROSS_PACKAGES",
    "aarch64_env",
    "add_aarch64_variant",
    "binfmt_problem",
    "check_aarch64_exec",
    "cross_rootfs_tarball",
    "ensure",
    "ensure_binfmt",
    "ensure_cross_image",
    "ensure_host_packages",
    "ensure_native_cross",
    "main",
    "missing_aarch64_libraries",
    "run_aarch64",
    "selftest",
]

CROSS_IMAGE = "fdl-rig-cross"
CROSS_REF = f"{CROSS_IMAGE}:latest"
CROSS_SUITE = "trixie"
CROSS_LINKER = "aarch64-linux-gnu-gcc"

#: Host packages: qemu (static, so LD_* variables never reach qemu itself) and
#: the aarch64 runtime the loader needs (libc, ld.so, libgcc_s).
HOST_PACKAGES = ("qemu-user-static", "libc6-arm64-cross", "libgcc-s1-arm64-cross")
#: Native cross builds with Debian's rustc-web: the aarch64 linker, the aarch64 std.
NATIVE_CROSS_PACKAGES = (
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "libstd-rust-web-dev:arm64",
)
FOREIGN_ARCH = "arm64"
#: Where those packages put the aarch64 ``/lib``: qemu's ``QEMU_LD_PREFIX``.
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"
AARCH64_LOADER = f"{AARCH64_SYSROOT}/lib/ld-linux-aarch64.so.1"

BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")

#: Image packages, native arch (resolved by apt in the chroot) ...
IMAGE_PACKAGES = (
    "rustc",
    "cargo",
    "gcc",
    "libc6-dev",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
)
#: ... and foreign arch (why the chroot needs ``dpkg --add-architecture arm64``).
IMAGE_FOREIGN_PACKAGES = ("libstd-rust-dev:arm64",)
#: Baked into the image: cargo and the cc crate pick the cross tools by themselves.
IMAGE_ENV = {
    "PATH": SYSTEM_PATH,
    "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER": CROSS_LINKER,
    "CC_aarch64_unknown_linux_gnu": CROSS_LINKER,
    "AR_aarch64_unknown_linux_gnu": "aarch64-linux-gnu-ar",
    "CARGO_HOME": "/tmp/cargo-home",
}
#: The image's own toolchain first, a mounted rustup's variables dropped, then the command.
IMAGE_ENTRYPOINT = [
    "/bin/sh",
    "-c",
    f'PATH={SYSTEM_PATH}; export PATH; unset RUSTUP_HOME RUSTUP_TOOLCHAIN; exec "$@"',
    CROSS_IMAGE,
]
#: Bumped when the image's configuration (not its packages) changes: re-imported then.
IMAGE_REVISION_LABEL, IMAGE_REVISION = "fdl-rig.cross-revision", "2"


# ------------------------------------------------------------ host: qemu binfmt


def _installed(package: str) -> bool:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0 and proc.stdout.strip() == "install ok installed"


def ensure_host_packages(packages: Sequence[str] = HOST_PACKAGES) -> None:
    """``apt-get install`` whichever of ``packages`` is missing (``apt-get update`` if needed)."""
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"installing {' '.join(missing)} needs root")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, capture_output=True, env=env, check=False).returncode != 0:
        run_logged(["apt-get", "update", "-q"], "apt-get update")
        run_logged(["env", "DEBIAN_FRONTEND=noninteractive", *install], shlex.join(install))


def _foreign_architectures() -> list[str]:
    proc = subprocess.run(
        ["dpkg", "--print-foreign-architectures"], capture_output=True, text=True, check=False
    )
    return proc.stdout.split()


def ensure_native_cross() -> None:
    """arm64 known to dpkg, then :data:`NATIVE_CROSS_PACKAGES` installed.

    After ``dpkg --add-architecture`` the first install finds no arm64 package
    lists, so :func:`ensure_host_packages` runs ``apt-get update`` and tries again.
    """
    if all(_installed(p) for p in NATIVE_CROSS_PACKAGES):
        return
    if FOREIGN_ARCH not in _foreign_architectures():
        if os.geteuid() != 0:
            raise RuntimeError(f"dpkg --add-architecture {FOREIGN_ARCH} needs root")
        run_logged(["dpkg", "--add-architecture", FOREIGN_ARCH], f"add {FOREIGN_ARCH} to dpkg")
    ensure_host_packages(NATIVE_CROSS_PACKAGES)


def _binfmt_rule() -> tuple[str, str]:
    """(entry name, rule line) from :data:`BINFMT_CONF` (``:name:type:...:flags``)."""
    if not BINFMT_CONF.is_file():
        raise RuntimeError(f"{BINFMT_CONF} is missing (apt-get install qemu-user-static)")
    for raw in BINFMT_CONF.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";")):
            return line.split(":")[1], line
    raise RuntimeError(f"{BINFMT_CONF} has no rule line")


def binfmt_problem() -> str | None:
    """Why an aarch64 ELF file cannot start here, or ``None`` when it can (no process run)."""
    entry = BINFMT_MISC / "qemu-aarch64"
    if not Path(AARCH64_LOADER).is_file():
        return f"{AARCH64_LOADER} is missing"
    if not entry.is_file() or "enabled" not in entry.read_text().splitlines():
        return f"{entry} is not registered and enabled"
    if (BINFMT_MISC / "status").read_text().strip() != "enabled":
        return f"{BINFMT_MISC} is disabled"
    return None


def ensure_binfmt() -> None:
    """Mount ``binfmt_misc``, register qemu-aarch64 once, enable it; then prove it runs.

    Registering is not idempotent in the kernel (a second write fails with
    EEXIST), so an existing entry of the same name is kept and only enabled.
    The rule's ``F`` flag opens the interpreter now, so it works in containers too.
    """
    if not (BINFMT_MISC / "register").exists():
        run_logged(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_MISC)],
            f"mount binfmt_misc on {BINFMT_MISC}",
        )
    name, rule = _binfmt_rule()
    entry = BINFMT_MISC / name
    if not entry.exists():
        (BINFMT_MISC / "register").write_text(rule + "\n")
    if "enabled" not in entry.read_text().splitlines():
        entry.write_text("1\n")
    if (BINFMT_MISC / "status").read_text().strip() != "enabled":
        (BINFMT_MISC / "status").write_text("1\n")
    check_aarch64_exec()


def check_aarch64_exec() -> str:
    """Run the aarch64 loader (an aarch64 ELF file) through binfmt; return its version line."""
    proc = subprocess.run(
        [AARCH64_LOADER, "--version"],
        capture_output=True,
        text=True,
        env=aarch64_env(None),
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{AARCH64_LOADER} --version does not run (binfmt or {AARCH64_SYSROOT} missing?): "
            f"status {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout.splitlines()[0] if proc.stdout else ""


# ------------------------------------------------------------ cross image


def cross_rootfs_tarball() -> Path:
    """Cached rootfs tarball (may not exist yet); its name changes with the package list."""
    packages = " ".join((*IMAGE_PACKAGES, *IMAGE_FOREIGN_PACKAGES))
    digest = hashlib.sha256(packages.encode()).hexdigest()[:12]
    return CACHE_DIR / f"{CROSS_SUITE}-minbase-cross-aarch64-{digest}.tar"


def _cross_mirror() -> str:
    """The mirror apt uses for trixie, else the one it uses for this machine's suite."""
    mirror = apt_mirror(CROSS_SUITE)
    return apt_mirror() if mirror == DEFAULT_MIRROR else mirror


def _in_chroot(rootfs: Path, *cmd: str) -> list[str]:
    return ["chroot", str(rootfs), "env", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", *cmd]


def _populate_rootfs(rootfs: Path, mirror: str) -> None:
    """debootstrap, then arm64 multiarch and every package through apt in the chroot."""
    run_logged(
        ["debootstrap", "--variant=minbase", CROSS_SUITE, str(rootfs), mirror],
        f"debootstrap {CROSS_SUITE} from {mirror}",
    )
    run_logged(_in_chroot(rootfs, "dpkg", "--add-architecture", "arm64"), "add arm64")
    run_logged(_in_chroot(rootfs, "apt-get", "update", "-q"), "apt-get update (chroot)")
    packages = [*IMAGE_PACKAGES, *IMAGE_FOREIGN_PACKAGES]
    run_logged(
        _in_chroot(rootfs, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages),
        f"apt-get install {' '.join(packages)} (chroot)",
    )
    run_logged(_in_chroot(rootfs, "apt-get", "clean"), "apt-get clean (chroot)")
    # Package lists are stale in any image; 140 MB for two architectures.
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def _unmount_under(root: Path) -> None:
    """Lazily unmount anything left mounted below ``root`` (before deleting it)."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _build_cross_rootfs(dest: Path) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the cross rootfs (debootstrap, chroot) needs root")
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cross-rootfs-", dir=dest.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            _populate_rootfs(rootfs, _cross_mirror())
            partial = dest.with_name(dest.name + ".partial")
            run_logged(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
                "tar of the cross rootfs",
            )
            partial.replace(dest)
        finally:
            _unmount_under(Path(tmp))


def _image_revision(ref: str) -> str | None:
    """The image's :data:`IMAGE_REVISION_LABEL` (``""`` without one), ``None`` if no image."""
    if not image_exists(ref):
        return None
    template = f'{{{{ index .Config.Labels "{IMAGE_REVISION_LABEL}" }}}}'
    proc = subprocess.run(
        ["docker", "image", "inspect", "-f", template, ref],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip().replace("<no value>", "")


def _import_changes() -> list[str]:
    """``docker import --change`` arguments: environment, entrypoint, revision label."""
    changes = [f"ENV {key}={value}" for key, value in IMAGE_ENV.items()]
    changes += [f"ENTRYPOINT {json.dumps(IMAGE_ENTRYPOINT)}", 'CMD ["/bin/bash"]']
    changes.append(f"LABEL {IMAGE_REVISION_LABEL}={IMAGE_REVISION}")
    return [arg for change in changes for arg in ("--change", change)]


def ensure_cross_image(ref: str = CROSS_REF) -> str:
    """Make sure ``ref`` exists, of this revision; return it.

    Imported from the cached tarball (:func:`cross_rootfs_tarball`), which is
    built first if missing (about 3 minutes here, 1.4 GB).  Needs a running dockerd.
    """
    revision = _image_revision(ref)
    if revision == IMAGE_REVISION:
        return ref
    tarball = cross_rootfs_tarball()
    if not tarball.is_file():
        _build_cross_rootfs(tarball)
    old = _image_id(ref) if revision is not None else None
    run_logged(["docker", "import", *_import_changes(), str(tarball), ref], f"import {tarball}")
    if old and old != _image_id(ref):  # the earlier revision, untagged now
        subprocess.run(["docker", "image", "rm", old], capture_output=True, check=False)
    return ref


def _image_id(ref: str) -> str:
    proc = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip()


# ------------------------------------------------------------ stubs


def add_aarch64_variant(root: Path, arch: str, *, image: str = CROSS_REF) -> Path:
    """An aarch64 stub as ``root/libtorch/<arch>/lib/libtorch.so``; return the arch dir.

    :func:`rig.project.add_variant` with ``aarch64-linux-gnu-gcc`` run in ``image``
    as the owner of the ``lib`` dir, every path mounted at itself.  Skipped when an
    aarch64 stub for exactly this arch is already there and up to date.
    """
    lib_dir = libtorch_dir(root, arch) / "lib"
    lib_dir.mkdir(parents=True, exist_ok=True)
    info = lib_dir.stat()
    compiler = ["docker", "run", "--rm", "--user", f"{info.st_uid}:{info.st_gid}"]
    compiler += ["-v", f"{FIXTURE_DIR}:{FIXTURE_DIR}:ro", "-v", f"{lib_dir}:{lib_dir}"]
    compiler += [image, CROSS_LINKER]
    return add_variant(root, arch, machine="aarch64", compiler=compiler)


# ------------------------------------------------------------ running aarch64 binaries


def aarch64_env(library_path: str | None) -> dict[str, str]:
    """This process's environment set up for an aarch64 binary.

    ``QEMU_LD_PREFIX`` points qemu at the aarch64 ``/lib``; ``LD_LIBRARY_PATH`` is
    exactly ``library_path`` (removed when ``None``).
    """
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["QEMU_LD_PREFIX"] = AARCH64_SYSROOT
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = library_path
    return env


def run_aarch64(
    argv: Sequence[str], library_path: str | None, *, trace: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run an aarch64 program through binfmt/qemu, output captured, whatever its status.

    ``trace``: ``LD_TRACE_LOADED_OBJECTS=1``, with which the aarch64 loader
    prints ldd's lines for the program instead of running it.
    """
    env = aarch64_env(library_path)
    if trace:
        env["LD_TRACE_LOADED_OBJECTS"] = "1"
    return subprocess.run(
        list(argv), capture_output=True, text=True, env=env, check=False, timeout=60
    )


def missing_aarch64_libraries(binary: Path, library_path: str | None) -> list[str]:
    """ldd's ``=> not found`` names for an aarch64 ``binary`` with this ``LD_LIBRARY_PATH``."""
    proc = run_aarch64([AARCH64_LOADER, str(binary)], library_path, trace=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tracing {binary} failed ({proc.returncode}): {proc.stderr.strip()}")
    return [
        line.split("=>", 1)[0].strip()
        for line in proc.stdout.splitlines()
        if line.rstrip().endswith("=> not found")
    ]


# ------------------------------------------------------------ set-up, self-test, CLI

SELFTEST_ARCH = "precompiled/cu128-aarch64"


def ensure() -> str:
    """Everything an emulated aarch64 host and a cross build need; the image reference."""
    ensure_host_packages()
    ensure_binfmt()
    ensure_native_cross()
    ensure_dockerd()
    return ensure_cross_image()


def _cross_build(root: Path, arch: str, image: str) -> Path:
    """The aarch64 build of ``ddp-bench`` exactly as prebuild renders it (docker run mode)."""
    from fdl_tasks.build.backends.docker_run import docker_line
    from fdl_tasks.build.backends.registry import backend_for
    from fdl_tasks.build.build_plan import plan_builds
    from fdl_tasks.config.model import Cluster, Controller, CrossSetup, DockerSettings, Worker

    docker = DockerSettings(image=image)
    controller = Controller(path=str(root), docker=docker, cross={"aarch64": CrossSetup()})
    worker = Worker(host="selftest", path=str(root), arch=arch)
    cpu_archs = {"selftest": "aarch64"}
    job = plan_builds(
        [worker],
        backend_for(Cluster(controller)),
        "ddp-bench",
        "ddp-bench",
        False,
        cpu_archs=cpu_archs,
    )[0]
    command = docker_line(job, controller, docker, "selftest", None)
    run_logged(["sh", "-c", command], f"cross build: {command}")
    return root / job.built_binary


def _expect(ok: bool, what: str, proc: subprocess.CompletedProcess[str] | None = None) -> None:
    if not ok:
        detail = f" (status {proc.returncode}: {proc.stdout}{proc.stderr})" if proc else ""
        raise RuntimeError(f"cross self-test: {what}{detail}")


def selftest(workdir: Path, image: str = CROSS_REF) -> list[str]:
    """Fixture, aarch64 stub, cross build, runs under qemu with and without the lib dir.

    Returns one line per step; raises ``RuntimeError`` on the first failure.
    """
    start = time.monotonic()
    make_project(workdir, [])
    lib_dir = str(add_aarch64_variant(workdir, SELFTEST_ARCH, image=image) / "lib")
    report = [f"aarch64 stub in {lib_dir}: {time.monotonic() - start:.1f}s"]
    start = time.monotonic()
    binary = _cross_build(workdir, SELFTEST_ARCH, image)
    report.append(f"cross build {binary}: {time.monotonic() - start:.1f}s")
    good = run_aarch64([str(binary), "x"], lib_dir)
    _expect(good.returncode == 0 and f"variant={SELFTEST_ARCH}" in good.stdout, "run", good)
    report.append(f"with LD_LIBRARY_PATH: {good.stdout.splitlines()[0]}")
    bad = run_aarch64([str(binary)], None)
    _expect(bad.returncode != 0 and "libtorch.so" in bad.stderr, "run without lib dir", bad)
    report.append(f"without: status {bad.returncode}: {bad.stderr.strip()}")
    _expect(missing_aarch64_libraries(binary, lib_dir) == [], "trace with lib dir")
    missing = missing_aarch64_libraries(binary, None)
    _expect(missing == ["libtorch.so"], f"trace without lib dir: {missing}")
    report.append(f"trace without LD_LIBRARY_PATH: not found {missing}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m rig.cross ensure|selftest [--workdir DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m rig.cross")
    parser.add_argument("action", choices=["ensure", "selftest"])
    parser.add_argument("--workdir", type=Path, help="selftest project dir (default: a temp dir)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    ref = ensure()
    print(
        f"aarch64 binfmt, native cross toolchain and cross image {ref} ready "
        f"({time.monotonic() - start:.1f}s)"
    )
    if args.action == "selftest":
        with tempfile.TemporaryDirectory(prefix="fdl-cross-selftest-") as tmp:
            print("\n".join(selftest(args.workdir or Path(tmp), ref)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
