"""``inv prebuild --watch`` and real editors' saves: ``sed -i`` and a vim-style
rename-write leave temporary and backup files beside the source for a moment; the
cycle they start lists only the file the user edited."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec
from tests.rig.test_watch import ARCHS, ENV, cycles, main_rs, set_rev, wait_cycle

pytestmark = [pytest.mark.rig]

HOSTS = [HostSpec("w-blackwell", "127.0.0.130"), HostSpec("w-cpu", "127.0.0.131")]
EDITOR_ARCHS = {host: ARCHS[host] for host in ("w-blackwell", "w-cpu")}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted(set(EDITOR_ARCHS.values()))
    with start_rig(tmp_path_factory.mktemp("editors"), HOSTS, variants) as cluster:
        set_rev(cluster, "0")
        yield cluster


def vim_write(rig: RigCluster, rev: str) -> None:
    """Vim's ``backupcopy=no`` save: probe the dir with ``4913``, keep ``main.rs~``,
    write the new text to a new file and rename it over the old."""
    src = main_rs(rig)
    probe = src.parent / "4913"
    probe.write_text("")
    probe.unlink()
    backup = src.with_name("main.rs~")
    os.replace(src, backup)
    fresh = src.with_name(".main.rs.swx")
    fresh.write_text(backup.read_text().replace("rev=0", f"rev={rev}"))
    os.replace(fresh, src)
    backup.unlink()


def test_sed_and_vim_saves_list_only_the_real_file(rig: RigCluster) -> None:
    workers = [rig.worker(host, arch=arch) for host, arch in EDITOR_ARCHS.items()]
    path = rig.write(workers, "editors.yaml")
    run = rig.background(
        "prebuild", "--cmd", "ddp-bench", "--watch", "--cluster-file", str(path), env=ENV
    )
    assert wait_cycle(run, 1, 180)[0] == "ok", run.stderr
    subprocess.run(["sed", "-i", "s/rev=0/rev=1/", str(main_rs(rig))], check=True)
    assert wait_cycle(run, 2)[0] == "ok", run.stderr
    set_rev(rig, "0")  # and back, through vim
    assert wait_cycle(run, 3)[0] == "ok", run.stderr
    vim_write(rig, "2")
    assert wait_cycle(run, 4)[0] == "ok", run.stderr
    time.sleep(3)  # a temporary file alone must start no cycle of its own
    assert len(cycles(run)) == 4, run.stderr
    lines = [text for _, text in run.lines if text.startswith("watch: cycle")]
    for line in lines[1:]:
        assert "(ddp-bench/src/main.rs changed)" in line, run.stderr
