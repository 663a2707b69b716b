"""The controller's view of the project is a real SSHFS mount (Debian's ``sshfs``,
through the rig's own sshd), for real.

SFTP v3 carries whole-second times, so a save in the second cargo's dep-info
was stamped reads back with the same mtime: cargo's rule calls the unit fresh,
and the host would run the binary of the save before. Each attempt saves
main.rs, runs ``inv prebuild`` in the background, saves again through the mount
as soon as cargo has compiled the binary, and checks by running the host's
published binary after the next ``inv prebuild``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, start_rig
from rig.project import FIXTURE_DIR
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig]

HOSTS = [HostSpec("sf1", "127.0.0.152")]
ARCH = "precompiled/cu128"
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
MAIN_RS = "ddp-bench/src/main.rs"
PRINT = 'cuda={cuda}");'
#: Attempts at a save landing in the second of cargo's dep-info before the test gives up.
ATTEMPTS = 8
SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RigCluster, Path]]:
    if shutil.which("sshfs") is None:
        pytest.skip("sshfs is not installed (scripts/setup installs it)")
    with start_rig(tmp_path_factory.mktemp("sshfs"), HOSTS, [ARCH]) as cluster:
        spec = cluster.rig.spec("sf1")
        mount = cluster.root / "sshfs-view"
        mount.mkdir()
        options = ",".join(
            [
                f"IdentityFile={cluster.rig.client_key}",
                "IdentitiesOnly=yes",
                "StrictHostKeyChecking=no",
                "UserKnownHostsFile=/dev/null",
                "BatchMode=yes",
            ]
        )
        source = f"{spec.user}@{spec.address}:{cluster.project}"
        subprocess.run(
            ["sshfs", source, str(mount), "-p", str(spec.port), "-o", options],
            check=True,
            timeout=30,
        )
        try:
            yield cluster, mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False, timeout=30)


def save(main: Path, rev: str) -> int:
    """main.rs printing ``rev=<rev>``, written through the mount; the mtime it reads back."""
    text = (FIXTURE_DIR / MAIN_RS).read_text().replace(PRINT, f'cuda={{cuda}} rev={rev}");')
    main.write_text(text)
    return main.stat().st_mtime_ns


def printed(rig: RigCluster) -> str:
    envelope = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    entry = decode(envelope.read_text(), str(envelope))["sf1"]
    return rig.run_on_host("sf1", str(rig.project), entry).rpartition("rev=")[2]


def dep_info(project: Path) -> Path | None:
    """cargo's dep-info of the binary's unit (its mtime is the unit's build start)."""
    found = list(project.glob("target/cluster/*/*/release/.fingerprint/ddp-bench-*/dep-bin-*"))
    return found[0] if found else None


def changed_ns(path: Path | None) -> int:
    try:
        return path.stat().st_ctime_ns if path else 0
    except OSError:
        return 0


def test_a_save_in_the_second_of_the_build_through_sshfs(view: tuple[RigCluster, Path]) -> None:
    rig, mount = view
    cluster = rig.write([rig.worker("sf1", arch=ARCH)], "sshfs.yaml", path=str(mount))
    main = mount / MAIN_RS
    args = ("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(cluster))
    assert save(main, "x") % SECOND == 0  # SFTP v3 carries whole seconds
    landed = False
    for attempt in range(ATTEMPTS):
        built_rev, saved_rev = f"a{attempt}", f"b{attempt}"
        save(main, built_rev)
        before = changed_ns(dep_info(rig.project))
        run = rig.background(*args, env=ENV)
        deadline = time.monotonic() + 120
        while changed_ns(dep_info(rig.project)) <= before and run.process.poll() is None:
            assert time.monotonic() < deadline, run.stderr
            time.sleep(0.002)  # until cargo has compiled the binary
        second = save(main, saved_rev)  # the same size as the first save
        assert run.finish() == 0, run.stderr
        stamped = dep_info(rig.project)
        assert stamped is not None
        if printed(rig) != built_rev:
            continue  # cargo read the second save: nothing to catch
        cargo_fresh = second <= (mount / stamped.relative_to(rig.project)).stat().st_mtime_ns
        done = rig.inv(*args, env=ENV)
        assert done.returncode == 0, done.stderr
        assert printed(rig) == saved_rev, done.stderr
        # and the summary says so: a relink in the second of the last, at the same size,
        # shows the same stat through the mount
        row = next(line for line in done.stderr.splitlines() if line.startswith("sf1 "))
        assert " rebuilt " in row, done.stderr
        if cargo_fresh:  # cargo's mtime rule alone would have kept the first save's binary
            landed = True
            break
    assert landed, f"no save landed in the second of cargo's dep-info in {ATTEMPTS} attempts"
