"""Quiet by default, complete on request, through the real ``inv`` (issue 39): on an
unchanged healthy rig a note is said once; ``-v`` says it again, and so does a
changed cluster file. Errors and warnings are never kept back.

Two rig hosts without ``data_path`` (so the default-data-path note is true of both),
no ``nvidia-smi`` on them, and a controller name (``ctrl``) no worker carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig]

HOSTS = [HostSpec("n-one", "127.0.0.132"), HostSpec("n-two", "127.0.0.133")]
ARCH = "precompiled/cpu"
GPU_ARCH = "precompiled/cu128"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("notes"), HOSTS, [ARCH, GPU_ARCH]) as cluster:
        yield cluster


def undeclared(rig: RigCluster, name: str, *, extra: str = "") -> Path:
    workers = []
    for host in ("n-one", "n-two"):
        worker = rig.worker(host, arch=ARCH)
        del worker["data_path"]
        workers.append(worker)
    path = rig.write(workers, name)
    if extra:
        path.write_text(path.read_text() + extra)
    return path


def notes(rig: RigCluster, path: Path, *options: str) -> list[str]:
    done = rig.inv("preflight", "--cluster-file", str(path), *options)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "preflight: 3 ok, 0 with warnings, 0 with errors", done.stderr
    assert not [line for line in lines if line.startswith("  ok ")], done.stderr
    return [line for line in lines if re.search(r"\bnote\b", line)]


def test_a_note_is_said_once_and_v_says_it_again(rig: RigCluster) -> None:
    path = undeclared(rig, "once.yaml")
    first = notes(rig, path)
    data = [
        line
        for line in first
        if "/flodl/data is missing on ctrl, n-one, n-two: fine without" in line
    ]
    assert len(data) == 1, "\n".join(first)
    assert any("note: the controller's name 'ctrl'" in line for line in first), first
    assert notes(rig, path) == []
    assert notes(rig, path, "-v") == first
    assert notes(rig, path, "--verbose") == first
    assert notes(rig, path) == []
    # an edit to the cluster file, even a comment, is news: every note once more
    changed = undeclared(rig, "once.yaml", extra="# edited\n")
    assert notes(rig, changed) == first
    assert notes(rig, changed) == []


def test_a_warning_is_never_kept_back(rig: RigCluster) -> None:
    workers = [rig.worker(h, arch=ARCH) for h in ("n-one", "n-two")]
    gone = rig.worker("n-two", arch=ARCH)
    workers.append({**gone, "host": "n-gone", "ssh": {**gone["ssh"], "target": "127.0.0.134"}})
    path = rig.write(workers, "down.yaml")
    for _ in range(2):
        done = rig.inv("preflight", "--cluster-file", str(path))
        assert "  warning  n-gone: unreachable" in done.stderr, done.stderr
        assert "  ok       n-one" in done.stderr, done.stderr  # beside a problem


def test_a_prebuild_says_how_its_builds_run_and_a_healthy_preflight_in_one_line(
    rig: RigCluster,
) -> None:
    """Two builds with the compile cache, cold: the first runs alone to fill it, and the
    line says so; the next prebuild's preflight is its summary line alone."""
    workers = [rig.worker("n-one", arch=ARCH), rig.worker("n-two", arch=GPU_ARCH)]
    path = rig.write(workers, "order.yaml")
    first = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), timeout=600)
    assert first.returncode == 0, first.stderr
    assert (
        "prebuild: 2 build(s) with native cargo, the first build alone to fill the cache, "
        "then 1 at a time (run "
    ) in first.stderr, first.stderr
    lines = first.stderr.splitlines()
    started = [i for i, line in enumerate(lines) if re.match(r"^prebuild: .+ started$", line)]
    ended = [i for i, line in enumerate(lines) if re.match(r"^prebuild: \S+ \(.*\) ok in ", line)]
    assert ended[0] < started[1], first.stderr  # really one after the other
    again = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), timeout=600)
    assert again.returncode == 0, again.stderr
    preflight = [line for line in again.stderr.splitlines() if line.startswith(("  ", "preflight"))]
    assert preflight[-1] == "preflight: 3 ok, 0 with warnings, 0 with errors", again.stderr
    assert not [line for line in preflight if line.startswith(("  ok", "  note"))], again.stderr
