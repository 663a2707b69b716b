"""A flodl project end to end on the rig (issue #42): ``inv prebuild`` finds the cluster
block in ``fdl.yml`` + ``fdl.cluster.yml`` by itself, builds and verifies each host's
binary, and ``inv launch`` hands that published envelope to flodl's launcher.

flodl's ``fdl`` cannot be built here (no crates.io): a stand-in ``fdl`` on ``PATH``
records its argv, working directory and environment. Each host's binary is then run as
flodl's agent spawn would run it from that envelope (its ``bin`` under the host's
``path``, its ``ld_library_path``), over the host's own sshd.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fdl_tasks.config.launch_mode import ENV_PREBUILD_PER_HOST
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, inv_argv, run_inv, start_rig, write_tasks_file
from rig.sshrig import HostSpec
from tests.unit.docs_text import blocks

pytestmark = pytest.mark.rig

HOSTS = [HostSpec("fl-a", "127.0.0.247"), HostSpec("fl-b", "127.0.0.248")]
ARCHS = {"fl-a": "precompiled/cu128", "fl-b": "precompiled/cpu"}
RECORDER = """\
#!{python}
import json, os, sys
with open({record!r}, "w") as out:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "envelope": os.environ.get("{variable}")}}, out)
sys.exit(7)
"""


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("flodl"), HOSTS, list(ARCHS.values())) as cluster:
        yield cluster


def flodl_project(rig: RigCluster) -> Path:
    """The rig's project as a flodl project: ``fdl.yml``, the ``cluster`` overlay with
    flodl's keys only, and ``tasks.py``; no ``cluster.yaml``, no setting."""
    project = rig.project
    write_tasks_file(project)
    (project / "fdl.yml").write_text("commands:\n  ddp-bench: {run: cargo run --bin ddp-bench}\n")
    workers = [
        rig.worker(host, arch=arch, local_devices=[0], nccl_socket_ifname="lo")
        for host, arch in ARCHS.items()
    ]
    controller = {"host": "127.0.0.1", "path": str(project)}
    overlay = {"cluster": {"controller": controller, "workers": workers}}
    overlay["commands"] = {"ddp-bench": {"cluster": True}}
    (project / "fdl.cluster.yml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    return project


def recording_fdl(directory: Path) -> dict[str, str]:
    """The stand-in ``fdl`` in ``directory``; ``PATH`` with it first."""
    directory.mkdir()
    fdl = directory / "fdl"
    record = directory / "record.json"
    fdl.write_text(
        RECORDER.format(python=sys.executable, record=str(record), variable=ENV_PREBUILD_PER_HOST)
    )
    fdl.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}


def test_prebuild_then_launch_through_flodl_s_launcher(rig: RigCluster, tmp_path: Path) -> None:
    project = flodl_project(rig)
    built = run_inv(project, "prebuild", "--cmd", "ddp-bench", env=rig.environment(), timeout=600)
    assert built.returncode == 0, built.stderr
    published = (project / "target/cluster/_envelopes/ddp-bench.json").read_text()
    envelope = decode(published, "envelope")
    assert sorted(envelope) == sorted(ARCHS)

    path = recording_fdl(tmp_path / "bin")
    record = tmp_path / "bin" / "record.json"
    launched = run_inv(
        project, "launch", "--cmd", "ddp-bench", "--", "--epochs", "1", env=rig.environment(path)
    )
    assert launched.returncode == 7, launched.stderr
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["@cluster", "ddp-bench", "--no-prebuild", "--epochs", "1"]
    assert seen["cwd"] == str(project)
    assert seen["envelope"] == published.rstrip("\n")

    # What flodl's launcher starts on each host, from the envelope it was handed.
    handed = decode(seen["envelope"], ENV_PREBUILD_PER_HOST)
    for host, arch in ARCHS.items():
        line = rig.run_on_host(host, str(project), handed[host])
        assert f"variant={arch}" in line, line


def test_compose_md_s_train_task_prebuilds_then_hands_the_envelope_to_fdl(
    rig: RigCluster, tmp_path: Path
) -> None:
    """docs/compose.md's composed task, as printed, through the real ``inv``."""
    project = flodl_project(rig)
    page = Path(__file__).parents[2] / "docs" / "compose.md"
    train = next(b.text for b in blocks(page) if "def train(" in b.text)
    (project / "tasks.py").write_text(train)
    # Without fdl-tasks' collection, Invoke reads no INVOKE_FDL_* variable: the rig's
    # settings (its known_hosts, no ssh config) go in invoke.yaml, as a user's would.
    settings = {
        name.removeprefix("INVOKE_FDL_").lower(): value
        for name, value in rig.environment().items()
        if name.startswith("INVOKE_FDL_")
    }
    (project / "invoke.yaml").write_text(yaml.safe_dump({"fdl": settings}))
    path = recording_fdl(tmp_path / "bin")
    done = run_inv(project, "train", "--epochs", "2", env=rig.environment(path), timeout=600)
    assert done.returncode == 7, done.stderr  # the stand-in's exit code, through c.run
    seen = json.loads((tmp_path / "bin" / "record.json").read_text())
    assert seen["argv"] == ["@cluster", "ddp-bench", "--no-prebuild", "--epochs", "2"]
    published = (project / "target/cluster/_envelopes/ddp-bench.json").read_text()
    assert seen["envelope"] == published.rstrip("\n")


def test_watch_rereads_the_cluster_when_fdl_yml_changes(rig: RigCluster) -> None:
    """The cluster block is merged from several files: a save of the base alone (its
    part of the block) re-reads the cluster and probes again."""
    project = flodl_project(rig)
    argv = inv_argv("prebuild", "--cmd", "ddp-bench", "--watch")
    run = Running(argv, project, rig.environment())
    try:
        run.wait_for(lambda: "watch: cycle 1 ok" in run.stderr, timeout=300)
        base = project / "fdl.yml"
        base.write_text(base.read_text() + yaml.safe_dump({"cluster": {"env": {"X": "1"}}}))
        run.wait_for(lambda: "watch: cycle 2 " in run.stderr, timeout=120)
        line = next(t for _, t in run.lines if t.startswith("watch: cycle 2 "))
        assert "fdl.yml changed): preflight ok;" in line, line
    finally:
        run.stop()
