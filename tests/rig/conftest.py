"""Fixtures for tests against the ssh rig: real sshd per host, real ``inv`` runs."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from rig.docker_builder import (
    BUILDER_IMAGE,
    RIG_TAGS,
    ensure_builder_image,
    ensure_dockerd,
    toolchain_run_args,
)
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
                "INVOKE_FDL_SYSTEM_SSH_CONFIG": str(self.root / "no-system-ssh-config"),
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


def docker_settings() -> dict[str, Any]:
    return {
        "image": f"{BUILDER_IMAGE}:{{cuda_tag}}",
        "cuda_version": "12.8",
        "run_args": toolchain_run_args(),
    }


def run_on_host(rig: RigCluster, host: str, worker_path: str, entry: Any) -> str:
    """What the launcher does, by hand, over the host's own sshd."""
    command = (
        f"cd {shlex.quote(worker_path + '/' + entry.cwd_subpath)} && "
        f"LD_LIBRARY_PATH={shlex.quote(entry.ld_library_path)} "
        f"{shlex.quote(worker_path + '/' + entry.bin)}"
    )
    done = subprocess.run(
        rig.rig.ssh_argv(host, command), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[0]


class Running:
    """A real ``inv`` in the background whose stderr is collected as it comes."""

    started: ClassVar[list[Running]] = []

    def __init__(self, rig: RigCluster, *args: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "invoke", *args],
            cwd=rig.root,
            env=rig.environment(env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.stdout = self.stderr = ""
        self._readers = [
            threading.Thread(target=self._read, args=(name,), daemon=True)
            for name in ("stdout", "stderr")
        ]
        for reader in self._readers:
            reader.start()
        Running.started.append(self)

    def _read(self, name: str) -> None:
        stream = getattr(self.process, name)
        for line in stream:
            setattr(self, name, getattr(self, name) + line)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.process.poll() is None, self.stderr
            assert time.monotonic() < deadline, self.stderr
            time.sleep(0.1)

    def finish(self, timeout: float = 120) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code


@pytest.fixture(scope="session")
def rig_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rig")
