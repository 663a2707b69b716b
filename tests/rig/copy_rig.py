"""The copy-delivery rig shared by ``test_copy.py`` and ``test_copy_faults.py``.

Three hosts on a real sshd each: ``cp-a`` and ``cp-b`` are copy hosts whose
``path`` is a private directory holding only their own libtorch variant, as a
rented box outside the NFS domain would; ``cp-shared`` sees the project.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psutil

from rig.harness import RigCluster, Running, start_rig
from rig.sshrig import ENV_MARKER, RIG_USER, HostSpec

ARCHS = {"cp-a": "precompiled/cu126", "cp-b": "precompiled/cpu", "cp-shared": "precompiled/cu128"}
COPY_HOSTS = ("cp-a", "cp-b")
BIN = "target/cluster/{host}/{slug}/release/ddp-bench"
SENT = re.compile(r"copy: (\d+) host\(s\) sent [\d.]+ MB \((\d+) bytes\), (\d+) already current")


def binary(host: str) -> str:
    return BIN.format(host=host, slug=ARCHS[host].replace("/", "-"))


def private_dir(rig: RigCluster, host: str) -> Path:
    """``<rig>/private-<host>``: the host's own libtorch variant, owned by the ssh user."""
    return rig.root / f"private-{host}"


def make_private(rig: RigCluster, host: str) -> Path:
    view = private_dir(rig, host)
    shutil.rmtree(view, ignore_errors=True)
    variant = Path("libtorch") / ARCHS[host]
    shutil.copytree(rig.project / variant, view / variant, symlinks=True)
    shutil.chown(view, RIG_USER, RIG_USER)
    for parent, dirs, files in os.walk(view):
        for name in (*dirs, *files):
            shutil.chown(os.path.join(parent, name), RIG_USER, RIG_USER)
    return view


def write_cluster(rig: RigCluster, name: str, **overrides: dict[str, Any]) -> Path:
    workers = []
    for host, arch in ARCHS.items():
        fields: dict[str, Any] = {"arch": arch}
        if host in COPY_HOSTS:
            fields |= {"path": str(private_dir(rig, host)), "delivery": "copy"}
        workers.append(rig.worker(host, **(fields | overrides.get(host, {}))))
    return rig.write(workers, name)


def hosts(*addresses: str) -> list[HostSpec]:
    """cp-a and cp-b (copy hosts, logging in as the non-root ssh user), cp-shared."""
    users: list[Literal["root", "fdlrig"]] = ["fdlrig", "fdlrig", "root"]
    return [
        HostSpec(name, address, user=user)
        for name, address, user in zip(ARCHS, addresses, users, strict=True)
    ]


@contextlib.contextmanager
def copy_rig(specs: list[HostSpec]) -> Iterator[RigCluster]:
    """In a directory of its own under ``/tmp``: pytest's base directory is ``0700`` again
    whenever another pytest run starts, and the ssh user must traverse it."""
    root = Path(tempfile.mkdtemp(prefix="fdl-copy-rig-"))
    root.chmod(0o755)
    try:
        with start_rig(root, specs, list(ARCHS.values())) as cluster:
            for host in COPY_HOSTS:
                make_private(cluster, host)
            write_cluster(cluster, "cluster.yaml")
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def prebuild(rig: RigCluster, *options: str, name: str = "cluster.yaml") -> Any:
    return rig.inv(
        "prebuild", "--cmd", "ddp-bench", *options, "--cluster-file", str(rig.root / name)
    )


def sent(stderr: str) -> tuple[int, int, int]:
    """(hosts sent to, bytes sent, hosts already current) from the copy summary line."""
    match = SENT.search(stderr)
    assert match, f"no copy summary in:\n{stderr}"
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def launch(rig: RigCluster, *args: str) -> Any:
    return rig.inv(
        "launch", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml"), *args
    )


PAD_BYTES = 40 << 20  # a libtorch-linked binary's size: the pad makes the binary that big


def edit(rig: RigCluster, edition: int) -> None:
    """The program prints ``edition=N`` and carries 40 MB of random bytes."""
    source = rig.project / "ddp-bench/src"
    (source / "pad.bin").write_bytes(os.urandom(PAD_BYTES))
    main = source / "main.rs"
    text = re.sub(r'\n    println!\("edition=\d+ pad=\{\}", [^\n]*\n', "\n", main.read_text())
    marker = '    println!("ddp-bench variant={variant} cuda={cuda}");\n'
    line = (
        f'    println!("edition={edition} pad={{}}", '
        'std::hint::black_box(include_bytes!("pad.bin")).len());\n'
    )
    main.write_text(text.replace(marker, marker + line))


def on_host(rig: RigCluster, host: str, command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        rig.rig.ssh_argv(host, command), stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def parts(rig: RigCluster, host: str) -> list[Path]:
    return list((private_dir(rig, host) / binary(host)).parent.glob(".ddp-bench.fdl-part-*"))


def freeze_mid_upload(run: Running, rig: RigCluster, host: str, left: set[Path]) -> None:
    """SIGSTOP ``inv`` once a new part on ``host`` has grown but is not whole yet."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and run.process.poll() is None:
        growing = [p for p in set(parts(rig, host)) - left if 0 < p.stat().st_size < PAD_BYTES]
        if growing:
            run.process.send_signal(signal.SIGSTOP)
            with contextlib.suppress(FileNotFoundError):
                if growing[0].stat().st_size < PAD_BYTES:
                    return
            run.process.send_signal(signal.SIGCONT)
        time.sleep(0.001)
    raise AssertionError(f"the upload to {host} was not caught under way:\n{run.stderr}")


def sftp_sessions(rig: RigCluster, host: str) -> list[psutil.Process]:
    """The sshd session processes serving an SFTP channel to ``host`` (by the rig's marker)."""
    marker = str(rig.rig.host_dir(host))
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "sftp-server":
            continue
        with contextlib.suppress(psutil.Error):
            session = process.parent()
            if session and process.environ().get(ENV_MARKER) == marker:
                found.append(session)
    return found


def interrupt_mid_upload(rig: RigCluster, host: str, edition: int) -> Running:
    """Ctrl-C a prebuild while ``host``'s part grows: it fails without a traceback, and the
    host keeps its old binary and no part."""
    before = sha(private_dir(rig, host) / binary(host))
    edit(rig, edition)
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, host, set(parts(rig, host)))
    run.process.send_signal(signal.SIGINT)
    run.process.send_signal(signal.SIGCONT)
    assert run.finish(timeout=60) != 0
    assert "Traceback" not in run.stderr, run.stderr
    assert not parts(rig, host), run.stderr
    assert sha(private_dir(rig, host) / binary(host)) == before, run.stderr
    return run
