"""Faults the rig plants for real: a dropped ssh session, a held verification, a full or
read-only file system, a host's mount gone, a container the daemon refuses to remove.

Each is the real thing where the machine allows it (mounts need root, which the rig
runs as); where a test needs a fault at an exact moment, a per-host shim on the
host's ``PATH`` holds that host's verification until the test lets it go.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rig.docker_builder import BUILDER_IMAGE, RIG_TAGS, ensure_builder_image, ensure_dockerd
from rig.sshrig import Rig


def kill_sshd(config: Path) -> None:
    """SIGKILL a host's sshd and its per-connection sshd processes, nothing else.

    The session's shell is left orphaned, as when sshd crashes: the client
    only sees its connection drop.
    """
    listener = subprocess.run(
        ["pgrep", "-f", f"sshd -D -f {config}"], capture_output=True, text=True, check=True
    ).stdout.split()
    victims, frontier = set(listener), list(listener)
    while frontier:
        children = subprocess.run(
            ["pgrep", "-P", frontier.pop(), "-x", "sshd"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        victims.update(children)
        frontier += children
    for pid in victims:
        os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def held_verification(rig: Rig, host: str, flags: Path) -> Iterator[tuple[Path, Path]]:
    """``host``'s verification (its ``sha256sum``) waits, once started, until the test lets
    it go: yields (``started``, ``go``), two flag files; creating ``go`` releases it.

    A shim on the host's ``PATH``, as the rig's other per-host shims; preflight does
    not run ``sha256sum``, so only verification is held.
    """
    shim = rig.host_dir(host) / "bin" / "sha256sum"
    started, go = flags / f"{host}-verifying", flags / f"{host}-go"
    started.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    shim.write_text(
        "#!/bin/sh\n"
        f"touch {started}\n"
        f"i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
        'exec /usr/bin/sha256sum "$@"\n'
    )
    shim.chmod(0o755)
    try:
        yield started, go
    finally:
        shim.unlink()
        go.touch()


def run_root(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def tmpfs(at: Path, size: str) -> Iterator[Path]:
    """A ``size`` tmpfs mounted at ``at`` (made if missing), unmounted on the way out."""
    at.mkdir(parents=True, exist_ok=True)
    run_root(["mount", "-t", "tmpfs", "-o", f"size={size}", "fdl-rig-fault", str(at)])
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False, capture_output=True)


def unmount_leftovers(under: Path) -> list[str]:
    """The :func:`tmpfs` mounts below ``under`` that a killed run left (its ``finally``
    never ran), unmounted: pytest cannot clear a ``--basetemp`` that holds one."""
    root = under.resolve()
    left = [
        fields[1]
        for fields in (line.split() for line in Path("/proc/self/mounts").read_text().splitlines())
        if fields[0] == "fdl-rig-fault" and Path(fields[1]).is_relative_to(root)
    ]
    for target in sorted(left, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    return left


def fill(directory: Path) -> None:
    """Fill the file system holding ``directory`` until it refuses another byte."""
    with contextlib.suppress(OSError), (directory / "filler").open("wb") as out:
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    with contextlib.suppress(OSError):  # the last pages, byte by byte
        (directory / "filler-tail").write_bytes(b"\0" * 4096)


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` read-only for everyone, root included (a read-only bind mount of itself)."""
    run_root(["mount", "--bind", str(directory), str(directory)])
    try:
        run_root(["mount", "-o", "remount,bind,ro", str(directory)])
        yield
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)


@contextlib.contextmanager
def bind_view(source: Path, view: Path) -> Iterator[Path]:
    """A host's own view of ``source`` at ``view`` (a bind mount, as an NFS mount would be)."""
    view.mkdir(parents=True, exist_ok=True)
    run_root(["mount", "--bind", str(source), str(view)])
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False, capture_output=True)


def unmount(view: Path) -> None:
    """The mount disappears under the host: an empty directory is left."""
    run_root(["umount", "-l", str(view)])


@contextlib.contextmanager
def unremovable(container: str) -> Iterator[None]:
    """The daemon refuses to remove ``container``: an immutable file in its writable layer
    (``chattr +i``) makes the real ``docker rm -f`` fail with "operation not permitted",
    as a file pinned by a security tool does. Released, and the container removed, after."""
    upper = subprocess.run(
        ["docker", "inspect", "-f", "{{.GraphDriver.Data.UpperDir}}", container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pinned = Path(upper) / "fdl-rig-pinned"
    pinned.touch()
    run_root(["chattr", "+i", str(pinned)])
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(pinned)], check=False, capture_output=True)
        subprocess.run(["docker", "rm", "-f", container], check=False, capture_output=True)


class PrivateDockerd:
    """A second Docker daemon of the test's own (socket, data root, exec root, containerd),
    so that restarting it never touches the daemon other runs share. Its own bridge
    (:data:`BRIDGE`, made here) and no iptables rules. Never ``--bridge=none``: a
    daemon started so deletes the host's ``docker0``, the shared daemon's bridge.
    ``images`` are copied in from the shared daemon (``docker save | docker load``)."""

    #: The private daemon's bridge and its address (a benchmarking range, RFC 2544).
    BRIDGE, ADDRESS = "fdlrig-dd0", "198.18.213.1/24"

    def __init__(self, images: list[str]) -> None:
        # Short: containerd's sockets live under the exec root (Unix sockets allow ~107).
        self.home = Path(tempfile.mkdtemp(prefix="fdd-", dir="/tmp"))
        self.socket = self.home / "d.sock"
        self.host = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None
        self.images = images

    def start(self, timeout: float = 60) -> None:
        if subprocess.run(["ip", "link", "show", self.BRIDGE], capture_output=True).returncode:
            run_root(["ip", "link", "add", "name", self.BRIDGE, "type", "bridge"])
            run_root(["ip", "addr", "add", self.ADDRESS, "dev", self.BRIDGE])
            run_root(["ip", "link", "set", self.BRIDGE, "up"])
        log = (self.home / "dockerd.log").open("ab")
        self.process = subprocess.Popen(
            [
                *("dockerd", "--host", self.host, "--data-root", str(self.home / "data")),
                *("--exec-root", str(self.home / "x"), "--pidfile", str(self.home / "d.pid")),
                *(f"--bridge={self.BRIDGE}", "--iptables=false", "--ip6tables=false"),
                "--ip-masq=false",
                "--shutdown-timeout=2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while self.docker("info").returncode != 0:
            assert self.process.poll() is None, (self.home / "dockerd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the private dockerd did not answer"
            time.sleep(0.3)

    def load_images(self) -> None:
        saved = subprocess.Popen(["docker", "save", *self.images], stdout=subprocess.PIPE)
        loaded = subprocess.run(
            ["docker", "load"], stdin=saved.stdout, env=self.env(), capture_output=True
        )
        assert saved.wait() == 0 and loaded.returncode == 0, loaded.stderr

    def stop(self) -> None:
        """SIGTERM, as ``systemctl restart docker`` does; the daemon stops its containers."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        subprocess.run(["ip", "link", "delete", self.BRIDGE], check=False, capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", *args], env=self.env(), capture_output=True, text=True, check=False
        )


@contextlib.contextmanager
def private_dockerd() -> Iterator[PrivateDockerd]:
    """A :class:`PrivateDockerd` with the rig's builder images, up for the block, then gone."""
    ensure_dockerd()
    ensure_builder_image(BUILDER_IMAGE, RIG_TAGS)
    daemon = PrivateDockerd([f"{BUILDER_IMAGE}:{tag}" for tag in RIG_TAGS])
    try:
        daemon.start()
        daemon.load_images()
        yield daemon
    finally:
        daemon.remove()
