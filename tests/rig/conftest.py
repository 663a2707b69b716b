"""Fixtures for tests against the ssh rig (real sshd per host, real ``inv`` runs).

The rig itself, its cluster files and its ``inv`` runs are :mod:`rig.harness`.
"""

from __future__ import annotations

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
    from fdl_tasks.build.docker_api import DockerApi, DockerError, container_name, labels_of
    from fdl_tasks.build.warm_containers import WARM_LABEL

    base = str(tmp_path_factory.getbasetemp())
    docker = DockerApi()
    try:
        for container in docker.containers([WARM_LABEL]):
            if labels_of(container).get(WARM_LABEL, "").startswith(base):
                docker.remove_container(container_name(container))
    except DockerError:
        pass  # no daemon: no container
