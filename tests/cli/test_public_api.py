"""Composition through the public names only: ``fdl_tasks.__all__`` used from a tasks.py.

Real ``inv`` runs under ``--dry`` (no host is contacted); the cluster's hosts
are placeholders.
"""

from __future__ import annotations

from pathlib import Path

import fdl_tasks
from rig.harness import run_inv

CLUSTER = """\
controller: {{path: {root}}}
workers:
  - {{host: a, path: /mnt/p, arch: precompiled/cu128, ssh: {{target: 127.0.0.9}}}}
"""
WRAPPED = """\
from invoke import Collection, task

from fdl_tasks import ns as fdl, prebuild


@task
def ship(c):
    published = prebuild(c, "x", cluster_file="cluster.yaml", verify=False)
    print("published:", published)


ns = Collection(ship)
ns.add_collection(fdl, "fdl")
"""
DIRECT = """\
from invoke import task

from fdl_tasks import FdlError, preflight


@task
def ready(c, cluster_file="cluster.yaml"):
    try:
        verdicts = preflight(c, cluster_file=cluster_file)
    except FdlError as exc:
        raise SystemExit(f"not ready: {exc}")
    print("verdicts:", verdicts)
"""


def project(tmp_path: Path, tasks: str) -> Path:
    (tmp_path / "tasks.py").write_text(tasks)
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(root=tmp_path))
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.rs").write_text("fn main() {}\n")
    (tmp_path / "libtorch" / "precompiled" / "cu128" / "lib").mkdir(parents=True)
    return tmp_path


def test_the_public_names() -> None:
    assert set(fdl_tasks.__all__) == {
        "FdlError",
        "Published",
        "Stopped",
        "Verdict",
        "ns",
        "prebuild",
        "preflight",
    }
    assert all(hasattr(fdl_tasks, name) for name in fdl_tasks.__all__)


def test_a_task_wrapping_prebuild(tmp_path: Path) -> None:
    root = project(tmp_path, WRAPPED)
    done = run_inv(root, "--dry", "ship")
    assert done.returncode == 0, done.stderr
    assert "published: None" in done.stdout  # --dry publishes nothing
    assert "--bin x" in done.stderr and "[a] ssh 127.0.0.9:22" in done.stderr
    assert "fdl.prebuild" in run_inv(root, "--list").stdout


def test_a_task_calling_preflight(tmp_path: Path) -> None:
    root = project(tmp_path, DIRECT)
    done = run_inv(root, "--dry", "ready")
    assert done.returncode == 0, done.stderr
    assert "verdicts: []" in done.stdout and "[a] ssh 127.0.0.9:22" in done.stderr
    missing = run_inv(root, "--dry", "ready", "--cluster-file", "other.yaml")
    assert missing.returncode == 1 and "not ready: cluster file other.yaml not found" in (
        missing.stderr
    )
