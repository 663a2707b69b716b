"""Docker side of the test rig: a local dockerd and an offline-built builder image.

The image is a Debian bookworm ``minbase`` rootfs (plus gcc/libc6-dev, which
cargo needs as its linker) made with ``debootstrap`` from the apt mirror this
machine is already configured with, then ``docker import``-ed.  No registry is
involved.  Rust: where the host has a rustup toolchain, :func:`toolchain_run_args`
bind-mounts it read-only into every container and the image has none; where it
has none (a stock Debian), the image gets Debian's own ``rustc-web`` and
``cargo-web`` (bookworm's, 1.85) and the mounts are empty (:func:`image_packages`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.core.atomic_files import log_tail

__all__ = [
    "BUILDER_IMAGE",
    "CACHE_DIR",
    "CONTAINER_CARGO_HOME",
    "CONTAINER_RUSTUP_HOME",
    "DOCKERD_LOG",
    "SYSTEM_PATH",
    "apt_mirror",
    "ensure_builder_image",
    "ensure_dockerd",
    "host_toolchain",
    "image_exists",
    "image_packages",
    "rootfs_tarball",
    "run_logged",
    "toolchain_env",
    "toolchain_mounts",
    "toolchain_run_args",
]

BUILDER_IMAGE = "fdl-rig-builder"
SUITE = "bookworm"
INCLUDE_PACKAGES = ("gcc", "libc6-dev")
#: Debian's Rust, in the image only where the host has no rustup toolchain to mount.
RUST_PACKAGES = ("rustc-web", "cargo-web")
#: The image's package list, so that an image of another list is imported anew.
PACKAGES_LABEL = "fdl-rig.builder-packages"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

CACHE_DIR = Path(os.environ.get("FDL_RIG_CACHE", "/var/cache/fdl-rig"))
DOCKERD_LOG = Path(os.environ.get("FDL_RIG_DOCKERD_LOG", "/var/log/fdl-rig-dockerd.log"))

# Where the host toolchain appears inside containers.  Deliberately *not*
# /root/...: /root is mode 0700, so a ``--user 1000:1000`` container could not
# traverse it even if the mounted directories themselves are world-readable.
CONTAINER_RUSTUP_HOME = "/opt/rustup"
CONTAINER_CARGO_BIN = "/opt/cargo"
CONTAINER_CARGO_HOME = "/tmp/cargo-home"
CONTAINER_HOME = "/tmp"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# --------------------------------------------------------------------- dockerd


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def ensure_dockerd(timeout: float = 60) -> None:
    """Make sure a docker daemon answers; start ``dockerd`` by hand if none does.

    A daemon that already answers is left alone.  Otherwise ``dockerd`` is
    started detached (its own session, stdin closed, output appended to
    :data:`DOCKERD_LOG`) so it outlives the caller, and we poll ``docker info``
    until it answers or ``timeout`` seconds pass.
    """
    if _docker_answers():
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError("docker does not answer and no dockerd binary is on PATH")
    if os.geteuid() != 0:
        raise RuntimeError("docker does not answer and starting dockerd needs root")
    if _in_private_network_namespace():
        raise RuntimeError(
            "docker does not answer, and dockerd started from this private network "
            "namespace would stay in it (a container's --network host would then be this "
            "namespace, not the machine's): start dockerd outside it first"
        )
    pidfile = Path("/var/run/docker.pid")
    _drop_stale_pidfile(pidfile)
    proc = None if pidfile.exists() else _start_dockerd(dockerd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _docker_answers():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"dockerd exited with status {proc.returncode}; "
                f"tail of {DOCKERD_LOG}:\n{_dockerd_log_tail()}"
            )
        time.sleep(0.5)
    raise RuntimeError(
        f"docker did not answer within {timeout:.0f}s; tail of {DOCKERD_LOG}:\n"
        f"{_dockerd_log_tail()}"
    )


def _in_private_network_namespace() -> bool:
    """Whether this process runs in a network namespace of loopback alone, as ``unshare
    --net`` makes (``/proc/1/ns/net`` may not be readable to compare with)."""
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return False
    return all(line.split(":", 1)[0].strip() == "lo" for line in lines)


def _drop_stale_pidfile(pidfile: Path) -> None:
    """Remove the pid file of a daemon that died with the machine session."""
    if not pidfile.exists():
        return
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except (ValueError, ProcessLookupError, PermissionError):
        pidfile.unlink(missing_ok=True)


def _start_dockerd(dockerd: str) -> subprocess.Popen[bytes]:
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    with DOCKERD_LOG.open("ab") as log:
        log.write(f"\n=== fdl-rig starting dockerd at {time.ctime()} ===\n".encode())
        log.flush()
        return subprocess.Popen(
            [dockerd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _dockerd_log_tail() -> str:
    return log_tail(DOCKERD_LOG, 30) or f"(no log at {DOCKERD_LOG})"


# ---------------------------------------------------------------- apt mirror


def _mirrors_from_one_line(text: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # drop [signed-by=...] options
        parts = line.split()
        if len(parts) >= 3:
            found.append((parts[1], [parts[2]]))
    return found


def _mirrors_from_deb822(text: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        found.extend((uri, suites) for uri in fields.get("uris", "").split())
    return found


def apt_mirror(suite: str = SUITE) -> str:
    """The Debian mirror apt is configured with for ``suite`` (not -security etc.)."""
    candidates: list[tuple[str, list[str]]] = []
    main = Path("/etc/apt/sources.list")
    if main.is_file():
        candidates += _mirrors_from_one_line(main.read_text(errors="replace"))
    extra = Path("/etc/apt/sources.list.d")
    if extra.is_dir():
        for path in sorted(extra.iterdir()):
            if path.suffix == ".list":
                candidates += _mirrors_from_one_line(path.read_text(errors="replace"))
            elif path.suffix == ".sources":
                candidates += _mirrors_from_deb822(path.read_text(errors="replace"))
    for uri, suites in candidates:
        if suite in suites and uri.startswith(("http://", "https://", "file:")):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


# -------------------------------------------------------------- builder image


def image_exists(ref: str) -> bool:
    proc = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
    return proc.returncode == 0


def image_packages() -> tuple[str, ...]:
    """``debootstrap --include`` list: with Debian's Rust unless the host's is mounted."""
    if host_toolchain() is not None:
        return INCLUDE_PACKAGES
    return (*INCLUDE_PACKAGES, *RUST_PACKAGES)


def rootfs_tarball(packages: Sequence[str] = INCLUDE_PACKAGES) -> Path:
    """Path of the cached rootfs tarball with ``packages`` (may not exist yet)."""
    return CACHE_DIR / f"{SUITE}-minbase-{'-'.join(packages)}.tar"


def _image_label(ref: str, label: str) -> str | None:
    """The image's ``label`` (``""`` without one), ``None`` if there is no such image."""
    proc = subprocess.run(
        ["docker", "image", "inspect", "-f", f'{{{{ index .Config.Labels "{label}" }}}}', ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip().replace("<no value>", "")


def run_logged(cmd: list[str], what: str) -> None:
    """Run ``cmd`` quietly; on failure raise with ``what`` and the last 40 lines of its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"{what} failed with status {proc.returncode}:\n{tail}")


def _build_rootfs_tarball(dest: Path, packages: Sequence[str]) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the builder rootfs with debootstrap needs root")
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror()
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=dest.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            f"debootstrap {SUITE} from {mirror}",
        )
        # Trim what a build container never needs.
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        run_logged(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
            "tar of the rootfs",
        )
        partial.replace(dest)


def ensure_builder_image(name: str = BUILDER_IMAGE, tags: Sequence[str] = ("latest",)) -> str:
    """Make sure ``name:tag`` exists for every tag in ``tags``, of :func:`image_packages`.

    All tags point at the same image; a tag of an image with another package
    list (:data:`PACKAGES_LABEL`) is moved to a fresh import.  The rootfs tarball
    is cached under :data:`CACHE_DIR`, so a fresh docker daemon re-imports it
    without running debootstrap again.  Returns ``name``.
    """
    wanted = list(dict.fromkeys(tags)) or ["latest"]
    packages = image_packages()
    label = ",".join(packages)
    labels = {tag: _image_label(f"{name}:{tag}", PACKAGES_LABEL) for tag in wanted}
    current = [tag for tag in wanted if labels[tag] == label]
    if len(current) == len(wanted):
        return name
    stale = {_image_id(f"{name}:{tag}") for tag in wanted if labels[tag] is not None}
    if current:
        source = f"{name}:{current[0]}"
    else:
        source = f"{name}:{wanted[0]}"
        tarball = rootfs_tarball(packages)
        if not tarball.is_file():
            _build_rootfs_tarball(tarball, packages)
        changes = [
            f"ENV PATH={SYSTEM_PATH}",
            'CMD ["/bin/bash"]',
            f"LABEL {PACKAGES_LABEL}={label}",
        ]
        run_logged(
            [
                "docker",
                "import",
                *[a for c in changes for a in ("--change", c)],
                str(tarball),
                source,
            ],
            f"docker import {tarball}",
        )
    for tag in wanted:
        ref = f"{name}:{tag}"
        if ref != source and tag not in current:
            run_logged(["docker", "tag", source, ref], f"docker tag {source} {ref}")
    for image_id in stale - {_image_id(source), ""}:  # untagged now, unless another name has it
        subprocess.run(["docker", "image", "rm", image_id], capture_output=True, check=False)
    return name


def _image_id(ref: str) -> str:
    proc = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip()


# ------------------------------------------------------------------ toolchain


def _host_rustup_home() -> Path:
    env = os.environ.get("RUSTUP_HOME")
    return Path(env) if env else Path.home() / ".rustup"


def _host_cargo_home() -> Path:
    env = os.environ.get("CARGO_HOME")
    return Path(env) if env else Path.home() / ".cargo"


def _active_toolchain(rustup_home: Path) -> str:
    """Name of the host's active toolchain directory under ``rustup_home/toolchains``."""
    rustc = shutil.which("rustc") or str(_host_cargo_home() / "bin" / "rustc")
    try:
        proc = subprocess.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, check=True, cwd="/"
        )
        sysroot = Path(proc.stdout.strip()).resolve()
        toolchains = (rustup_home / "toolchains").resolve()
        if sysroot.parent == toolchains:
            return sysroot.name
    except (OSError, subprocess.CalledProcessError):
        pass
    settings = rustup_home / "settings.toml"
    if settings.is_file():
        match = re.search(r'^default_toolchain\s*=\s*"([^"]+)"', settings.read_text(), re.M)
        if match:
            name = match.group(1)
            if (rustup_home / "toolchains" / name).is_dir():
                return name
            for cand in sorted((rustup_home / "toolchains").glob(f"{name}-*")):
                return cand.name
    raise RuntimeError(f"cannot find an installed rust toolchain under {rustup_home}")


def host_toolchain() -> str | None:
    """The host's active rustup toolchain (its directory name), ``None`` without rustup."""
    try:
        return _active_toolchain(_host_rustup_home())
    except RuntimeError:
        return None


def toolchain_mounts() -> list[str]:
    """``SOURCE:TARGET:ro`` volumes that bring the host's Rust toolchain into a container.

    Host ``~/.rustup`` -> ``/opt/rustup`` and ``~/.cargo`` -> ``/opt/cargo``,
    outside ``/root`` so that any ``--user`` can traverse them.  None without a
    rustup toolchain on the host: the image has Debian's Rust then.
    """
    if host_toolchain() is None:
        return []
    rustup_home = _host_rustup_home()
    cargo_home = _host_cargo_home()
    mounts = [f"{rustup_home.resolve()}:{CONTAINER_RUSTUP_HOME}:ro"]
    if cargo_home.is_dir():
        mounts.append(f"{cargo_home.resolve()}:{CONTAINER_CARGO_BIN}:ro")
    return mounts


def toolchain_env() -> dict[str, str]:
    """The environment that makes the mounted toolchain work for any user, offline.

    ``PATH`` starts with the active toolchain's own ``bin`` (no rustup proxy
    needed); ``CARGO_HOME`` and ``HOME`` are writable directories under
    ``/tmp``, so a ``--user UID:GID`` without a passwd entry works too.  Without
    a host toolchain, ``PATH`` is the image's, which has Debian's cargo.
    """
    common = {"CARGO_HOME": CONTAINER_CARGO_HOME, "HOME": CONTAINER_HOME}
    toolchain = host_toolchain()
    if toolchain is None:
        return {**common, "PATH": SYSTEM_PATH, "CARGO_NET_OFFLINE": "true"}
    tc_bin = f"{CONTAINER_RUSTUP_HOME}/toolchains/{toolchain}/bin"
    return {
        "RUSTUP_HOME": CONTAINER_RUSTUP_HOME,
        "RUSTUP_TOOLCHAIN": toolchain,
        "CARGO_HOME": CONTAINER_CARGO_HOME,
        "HOME": CONTAINER_HOME,
        "PATH": f"{tc_bin}:{CONTAINER_CARGO_BIN}/bin:{SYSTEM_PATH}",
        "CARGO_NET_OFFLINE": "true",
    }


def toolchain_run_args() -> list[str]:
    """:func:`toolchain_mounts` and :func:`toolchain_env` as ``docker run`` arguments."""
    args = [f"--volume={mount}" for mount in toolchain_mounts()]
    return args + [f"--env={name}={value}" for name, value in toolchain_env().items()]


#: Tags the demo and the tests use: one per CUDA version their arches encode.
RIG_TAGS = ("12.8", "12.6", "11.8")
#: The names flodl's docker-compose.yml gives its images; the rig tags its builder so.
FLODL_CUDA_IMAGE, FLODL_DEV_IMAGE = "flodl-cuda", "flodl-dev"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rig.docker_builder ensure``: dockerd up and the builder image tagged."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rig.docker_builder")
    parser.add_argument("action", choices=["ensure"])
    parser.parse_args(argv)
    ensure_dockerd()
    ensure_builder_image(BUILDER_IMAGE, RIG_TAGS)
    ensure_builder_image(FLODL_CUDA_IMAGE, RIG_TAGS)
    ensure_builder_image(FLODL_DEV_IMAGE)
    print(
        f"docker builder image {BUILDER_IMAGE}:{{{','.join(RIG_TAGS)}}} ready, also as "
        f"{FLODL_CUDA_IMAGE}:{{...}} and {FLODL_DEV_IMAGE} for the compose project"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
