"""Composition through the public names only: ``fdl_tasks.__all__`` used from a tasks.py.

Real ``inv`` runs under ``--dry`` (no host is contacted); the cluster's hosts
are placeholders.
"""

from __future__ import annotations

import typing
from pathlib import Path

import attrs
import pytest

import fdl_tasks
from rig.harness import run_inv

CLUSTER = """\
controller: {{path: {root}}}
workers:
  - {{host: a, path: /mnt/p, arch: precompiled/cu128, ssh: {{target: 127.0.0.9}}}}
"""
WRAPPED = """\
import attrs
from invoke import Collection, task

from fdl_tasks import ns as fdl, prebuild, settings_of


@task
def ship(c):
    settings = attrs.evolve(settings_of(c), cluster_file="cluster.yaml", verify=False)
    published = prebuild(c, "x", settings=settings)
    print("published:", published)


ns = Collection(ship)
ns.add_collection(fdl, "fdl")
"""
DIRECT = """\
import attrs
from invoke import task

from fdl_tasks import FdlError, preflight, settings_of


@task
def ready(c, cluster_file="cluster.yaml"):
    try:
        settings = attrs.evolve(settings_of(c), cluster_file=cluster_file)
        verdicts = preflight(c, settings=settings)
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
        "HostBinary",
        "Published",
        "Settings",
        "Stopped",
        "Verdict",
        "ns",
        "prebuild",
        "preflight",
        "settings_of",
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


def leaves(hint: object) -> set[object]:
    """The classes a type hint is made of (a ``Literal``'s: its values' classes)."""
    if typing.get_origin(hint) is typing.Literal:
        return {type(value) for value in typing.get_args(hint)}
    parts = [part for part in typing.get_args(hint) if part is not Ellipsis]
    return set().union(*(leaves(part) for part in parts)) if parts else {hint}


def test_the_values_returned_are_the_api_s_own() -> None:
    """Frozen, and made of plain values and of each other: no internal class to reach."""
    public = {fdl_tasks.HostBinary, fdl_tasks.Published, fdl_tasks.Verdict}
    for kind in public:
        assert kind.__module__ == "fdl_tasks.api"
        for name, hint in typing.get_type_hints(kind).items():
            assert leaves(hint) <= {str, bool, Path} | public, f"{kind.__name__}.{name}"
    binary = fdl_tasks.HostBinary(
        host="a", binary="b", sha256="", rebuilt=False, verified=False, delivery="shared"
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        binary.host = "c"  # type: ignore[misc]
