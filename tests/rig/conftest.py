"""Fixtures for tests against the ssh rig: real sshd per host, real ``inv`` runs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from rig.docker_builder import BUILDER_IMAGE, RIG_TAGS, ensure_builder_image, ensure_dockerd
from rig.project import make_project
from rig.sshrig import HostSpec, Rig
from tests.conftest import isolated_env, run_inv


class RigCluster:
    """A running rig plus the cluster.yaml files the tests write for it."""

    def __init__(self, rig: Rig, root: Path, project: Path) -> None:
        self.rig, self.root, self.project = rig, root, project
        self.known_hosts = root / "known_hosts"

    def worker(self, name: str, **fields: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "host": name,
            "path": str(self.project),
            "data_path": str(self.rig.data_path(name)),
            "ssh": self.rig.ssh_entry(name),
        }
        entry.update(fields)
        return entry

    def write(
        self, workers: Sequence[dict[str, Any]], name: str = "cluster.yaml", **controller: Any
    ) -> Path:
        data = {
            "controller": {"path": str(self.project), **controller},
            "workers": list(workers),
            "env": {"FDL_TEST": "1"},
        }
        path = self.root / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Isolated from the user's fdl settings and ssh files, pointed at this rig."""
        return isolated_env(
            {
                "FLODL_HOST_NAME": "ctrl",
                "INVOKE_FDL_KNOWN_HOSTS": str(self.known_hosts),
                "INVOKE_FDL_SSH_CONFIG": str(self.root / "no-ssh-config"),
                **(env or {}),
            }
        )

    def inv(
        self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The real ``inv`` entry point, run in a directory with a plain tasks.py."""
        return run_inv(self.root, *args, env=self.environment(env), timeout=timeout)


def start_rig(
    tmp: Path, hosts: Sequence[HostSpec], variants: Sequence[str] = (), docker: bool = False
) -> Iterator[RigCluster]:
    """The hosts up, a project with those libtorch variants, and dockerd if asked for."""
    if docker:
        ensure_dockerd()
        ensure_builder_image(BUILDER_IMAGE, RIG_TAGS)
    rig = Rig(tmp / "rig")
    rig.up(hosts)
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    if variants:
        make_project(project, variants)
    (tmp / "tasks.py").write_text("from fdl_tasks import ns\n")
    try:
        yield RigCluster(rig, tmp, project)
    finally:
        rig.down()


@pytest.fixture(scope="session")
def rig_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rig")
