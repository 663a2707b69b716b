"""Fixtures for tests against the ssh rig (real sshd per host, real ``inv`` runs).

The rig itself, its cluster files and its ``inv`` runs are :mod:`rig.harness`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from rig.harness import Running


@pytest.fixture(autouse=True)
def no_background_inv() -> Iterator[None]:
    """A failed test must not leave an ``inv`` running: each one left is stopped."""
    yield
    Running.stop_all()


@pytest.fixture(scope="session", autouse=True)
def no_warm_container_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Warm build containers outlive the ``inv`` that made them: at the end of the session,
    every one of a project under this session's temporary directory is removed."""
    yield
    import docker as docker_sdk

    from fdl_tasks.build.warm_containers import WARM_LABEL

    base = str(tmp_path_factory.getbasetemp())
    try:
        with contextlib.closing(docker_sdk.from_env(timeout=10)) as client:
            for container in client.containers.list(all=True, filters={"label": WARM_LABEL}):
                if container.labels.get(WARM_LABEL, "").startswith(base):
                    container.remove(force=True)
    except docker_sdk.errors.DockerException:
        pass  # no daemon: no container
