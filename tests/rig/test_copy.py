"""Copy delivery on the rig, through the real ``inv`` (native cargo builds, real sshd, SFTP).

A ``copy`` host's ``path`` is a private directory of that host: it holds its own
libtorch variant and none of the project, as a rented box outside the NFS
domain would. The tests run in order, each starting from the state the one
before left (a first prebuild, a second one, an edit, faults).
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
from typing import Any

import psutil
import pytest

from rig.harness import RigCluster, Running, start_rig
from rig.sshrig import ENV_MARKER, RIG_USER, HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("cp-a", "127.0.0.230", user="fdlrig"),
    HostSpec("cp-b", "127.0.0.231", user="fdlrig"),
    HostSpec("cp-shared", "127.0.0.232"),
]
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


@pytest.fixture(scope="module")
def rig() -> Iterator[RigCluster]:
    """In a directory of its own under ``/tmp``: pytest's base directory is ``0700`` again
    whenever another pytest run starts, and the ssh user must traverse it."""
    root = Path(tempfile.mkdtemp(prefix="fdl-copy-rig-"))
    root.chmod(0o755)
    try:
        with start_rig(root, HOSTS, list(ARCHS.values())) as cluster:
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


def test_private_path_host_runs_its_own_variant(rig: RigCluster) -> None:
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert sent(done.stderr)[:1] == (2,)
    for host in COPY_HOSTS:
        copy = private_dir(rig, host) / binary(host)
        assert sha(copy) == sha(rig.project / binary(host))
        assert os.access(copy, os.X_OK)
        assert (private_dir(rig, host) / "ddp-bench").is_dir()  # the command's cwd_subpath
        assert not list(copy.parent.glob(".*fdl-part*"))
    assert "2 host(s) verified" not in done.stderr and "3 host(s) verified" in done.stderr
    ran = launch(rig)
    assert ran.returncode == 0, ran.stderr
    for host, arch in ARCHS.items():
        assert f"[{host}] ddp-bench variant={arch}" in ran.stdout


def test_second_prebuild_sends_nothing(rig: RigCluster) -> None:
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert sent(done.stderr) == (0, 0, 2)
    assert "copy: cp-a: sent" not in done.stderr


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


def test_edit_sends_once_and_a_running_binary_keeps_running(rig: RigCluster) -> None:
    """The old binary runs on cp-a during the upload; launch then runs the new one."""
    view = private_dir(rig, "cp-a")
    lib = view / "libtorch" / ARCHS["cp-a"] / "lib"
    old = on_host(rig, "cp-a", f"LD_LIBRARY_PATH={lib} {view / binary('cp-a')} --heartbeat 60")
    assert old.stdout is not None and "variant=" in old.stdout.readline()
    edit(rig, 2)
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    hosts, size, current = sent(done.stderr)
    assert (hosts, current) == (2, 0) and size > 2 * PAD_BYTES
    for host in COPY_HOSTS:
        assert done.stderr.count(f"copy: {host}: sent") == 1
        assert sha(private_dir(rig, host) / binary(host)) == sha(rig.project / binary(host))
    assert old.poll() is None, "the running binary was disturbed by the upload"
    assert old.stdout.readline().startswith(("args=", "step"))
    ran = launch(rig)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("edition=2") == 3, ran.stdout
    old.wait(timeout=20)  # launch stopped the stale one before its spawn


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


def test_killed_upload_leaves_no_partial_file(rig: RigCluster) -> None:
    before = {h: sha(private_dir(rig, h) / binary(h)) for h in COPY_HOSTS}
    edit(rig, 3)
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, "cp-a", set())
    run.process.kill()
    run.process.wait()
    for host in COPY_HOSTS:
        final = private_dir(rig, host) / binary(host)
        assert sha(final) in (before[host], sha(rig.project / binary(host)))
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    left = [(p, p.stat().st_size, p.stat().st_mtime, time.time()) for p in parts(rig, "cp-a")]
    assert not parts(rig, "cp-a") and not parts(rig, "cp-b"), (left, done.stderr)
    ran = launch(rig)
    assert ran.stdout.count("edition=3") == 3, ran.stdout


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


def test_dropped_connection_is_retried_once(rig: RigCluster) -> None:
    """cp-b's ssh session is killed mid-upload: the upload starts again on a new connection."""
    edit(rig, 4)
    left = set(parts(rig, "cp-b"))  # none unless an earlier failed run left one
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, "cp-b", left)
    sessions = sftp_sessions(rig, "cp-b")
    assert sessions, "no SFTP session to cp-b"
    for session in sessions:
        session.send_signal(signal.SIGKILL)
    run.process.send_signal(signal.SIGCONT)
    assert run.finish(timeout=240) == 0, run.stderr
    assert "copy: cp-b: connection dropped mid-upload" in run.stderr
    assert run.stderr.count("copy: cp-b: sent") == 1
    final = private_dir(rig, "cp-b") / binary("cp-b")
    assert sha(final) == sha(rig.project / binary("cp-b"))
    assert not parts(rig, "cp-b")


@pytest.fixture
def small_disk(rig: RigCluster) -> Iterator[Path]:
    """cp-b's path on an 8 MB tmpfs holding its libtorch variant: the binary needs 40."""
    view = private_dir(rig, "cp-b").with_name("small-cp-b")
    view.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(view)], check=True)
    try:
        variant = Path("libtorch") / ARCHS["cp-b"]
        shutil.copytree(private_dir(rig, "cp-b") / variant, view / variant, symlinks=True)
        subprocess.run(["chown", "-R", f"{RIG_USER}:{RIG_USER}", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_full_disk_and_unwritable_path_name_the_host_others_finish(
    rig: RigCluster, small_disk: Path
) -> None:
    locked = rig.root / "locked-cp-b"
    variant = Path("libtorch") / ARCHS["cp-b"]
    shutil.rmtree(locked, ignore_errors=True)  # root's: the ssh user reads it, cannot write
    shutil.copytree(private_dir(rig, "cp-b") / variant, locked / variant, symlinks=True)
    edit(rig, 5)
    for path, expected in [
        (small_disk, f"cp-b: not enough space in {small_disk / binary('cp-b')}".rsplit("/", 1)[0]),
        (locked, f"cp-b: {locked / binary('cp-b')}".rsplit("/", 1)[0] + " cannot be created"),
    ]:
        name = f"fault-{path.name}.yaml"
        write_cluster(rig, name, **{"cp-b": {"path": str(path)}})
        done = prebuild(rig, name=name)
        assert done.returncode == 1, done.stderr
        assert "copy to 1 host(s) failed; no envelope was published" in done.stderr
        assert expected in done.stderr, done.stderr
        if path == small_disk:
            assert re.search(r"needs \d+ bytes \([\d.]+ MB\), [\d.]+ MB free", done.stderr)
            assert "copy: sending to 1 host(s)" in done.stderr  # cp-b refused before sending
        assert "Traceback" not in done.stderr
        final = private_dir(rig, "cp-a") / binary("cp-a")
        assert sha(final) == sha(rig.project / binary("cp-a")), "cp-a did not finish"
    assert not list(small_disk.rglob("*fdl-part*"))


def test_missing_variant_on_a_copy_host_stops_before_any_build(rig: RigCluster) -> None:
    bare = rig.root / "bare-cp-b"
    bare.mkdir(exist_ok=True)
    shutil.chown(bare, RIG_USER, RIG_USER)
    name = "bare.yaml"
    write_cluster(rig, name, **{"cp-b": {"path": str(bare)}})
    done = prebuild(rig, name=name)
    assert done.returncode == 1, done.stderr
    lib = bare / "libtorch" / ARCHS["cp-b"] / "lib"
    assert f"cp-b: libtorch variant not found at {lib}" in done.stderr, done.stderr
    assert "nothing was built" in done.stderr
    assert " started" not in done.stderr and not (bare / "target").exists()


def push(rig: RigCluster, name: str) -> Any:
    return rig.inv("push-libtorch", "--host", "cp-b", "--cluster-file", str(rig.root / name))


def test_push_libtorch_moves_only_changed_files(rig: RigCluster) -> None:
    """After the test above: cp-b's bare path gets its variant, then nothing, then one file."""
    bare = rig.root / "bare-cp-b"
    variant = rig.project / "libtorch" / ARCHS["cp-b"]
    done = push(rig, "bare.yaml")
    assert done.returncode == 0, done.stderr
    files = sorted(p.relative_to(variant) for p in variant.rglob("*") if p.is_file())
    assert files and f"cp-b: {len(files)} of {len(files)} file(s) to send" in done.stderr
    for relative in files:
        copy = bare / "libtorch" / ARCHS["cp-b"] / relative
        assert copy.read_bytes() == (variant / relative).read_bytes()
    again = push(rig, "bare.yaml")
    assert f"cp-b: 0 of {len(files)} file(s) to send" in again.stderr, again.stderr
    extra = variant / "share" / "note.txt"
    extra.parent.mkdir(exist_ok=True)
    extra.write_text("one more file\n")
    try:
        third = push(rig, "bare.yaml")
        assert f"cp-b: 1 of {len(files) + 1} file(s) to send" in third.stderr, third.stderr
    finally:
        extra.unlink()
    built = prebuild(rig, name="bare.yaml")
    assert built.returncode == 0, built.stderr


CYCLE = re.compile(r"^watch: cycle (\d+) (ok|FAILED)")


def cycle_states(run: Running) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for _, line in list(run.lines) if (m := CYCLE.match(line))}


def test_watch_sends_each_edit_to_the_copy_hosts(rig: RigCluster) -> None:
    run = rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--watch",
        "--cluster-file",
        str(rig.root / "cluster.yaml"),
    )
    run.wait_for(lambda: 1 in cycle_states(run), 180)
    assert cycle_states(run)[1] == "ok", run.stderr
    edit(rig, 6)
    run.wait_for(lambda: 2 in cycle_states(run), 180)
    assert cycle_states(run)[2] == "ok", run.stderr
    for host in COPY_HOSTS:
        final = private_dir(rig, host) / binary(host)
        assert sha(final) == sha(rig.project / binary(host))
    view = private_dir(rig, "cp-a")
    lib = view / "libtorch" / ARCHS["cp-a"] / "lib"
    shown = on_host(rig, "cp-a", f"LD_LIBRARY_PATH={lib} {view / binary('cp-a')}")
    out, _ = shown.communicate(timeout=30)
    assert "edition=6" in out
    assert run.stop() in (0, 130, -signal.SIGINT), run.stderr


def test_ctrl_c_mid_upload_removes_the_temporary_file(rig: RigCluster) -> None:
    before = sha(private_dir(rig, "cp-a") / binary("cp-a"))
    edit(rig, 7)
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(rig.root / "cluster.yaml")
    )
    freeze_mid_upload(run, rig, "cp-a", set(parts(rig, "cp-a")))
    run.process.send_signal(signal.SIGINT)
    run.process.send_signal(signal.SIGCONT)
    assert run.finish(timeout=60) != 0
    assert "Traceback" not in run.stderr, run.stderr
    assert not parts(rig, "cp-a") and not parts(rig, "cp-b")
    assert sha(private_dir(rig, "cp-a") / binary("cp-a")) == before, run.stderr


def test_build_host_copies_to_its_copy_host(rig: RigCluster) -> None:
    edit(rig, 8)
    done = rig.inv(
        "build-host", "--host", "cp-a", "-c", "ddp-bench", "-f", str(rig.root / "cluster.yaml")
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("copy: cp-a: sent") == 1 and "copy: cp-b" not in done.stderr
    final = private_dir(rig, "cp-a") / binary("cp-a")
    assert sha(final) == sha(rig.project / binary("cp-a"))
