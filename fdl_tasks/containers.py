"""The Docker side of builds, through the Docker SDK and the compose CLI.

Everything here is checked or cleaned before or after the builds themselves:
the daemon and the images, compose and its service, container removal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from fdl_tasks.commands import RUN_LABEL
from fdl_tasks.errors import FdlError


def _docker_client() -> Any:
    import docker as docker_sdk

    return docker_sdk.from_env(version="auto", timeout=10)


def check_docker(images: Iterable[str], configured: str) -> None:
    """Before any build: the daemon answers and every image exists locally."""
    import docker as docker_sdk

    try:
        client = _docker_client()
        client.ping()
    except docker_sdk.errors.DockerException as exc:
        raise FdlError(
            f"the Docker daemon does not answer ({exc}); start it, or remove "
            "controller.docker from cluster.yaml to build with native cargo"
        ) from None
    missing = []
    try:
        for image in sorted(set(images)):
            try:
                client.images.get(image)
            except docker_sdk.errors.ImageNotFound:
                missing.append(image)
    except docker_sdk.errors.DockerException as exc:
        raise FdlError(f"the Docker daemon refused to look up image {image!r}: {exc}") from None
    finally:
        client.close()
    if missing:
        raise FdlError(
            f"Docker image(s) not found on this machine: {', '.join(missing)} "
            f"({configured}); build or pull them first"
        )


def find_compose() -> tuple[str, ...]:
    """``docker compose`` (v2, what flodl runs), else ``docker-compose`` (v1)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        answer = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if answer.returncode == 0:
            return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    raise FdlError(
        "controller.docker names a docker compose service, but neither 'docker compose' "
        "(the Compose plugin) nor 'docker-compose' is installed on the controller"
    )


def compose_images(
    compose_argv: Sequence[str],
    service: str,
    root: str,
    environments: Iterable[dict[str, str]],
) -> set[str]:
    """The images the service resolves to under each build's variables; the service must exist.

    ``docker compose config`` interpolates the file exactly as ``run`` will.
    """
    images = set()
    for environment in {tuple(sorted(e.items())) for e in environments}:
        answer = _compose(compose_argv, ["config"], root, dict(environment), "config failed")
        services = (yaml.safe_load(answer) or {}).get("services") or {}
        if service not in services:
            raise FdlError(
                f"cluster.yaml names the compose service {service!r}, but the "
                f"compose file in {root} defines only: {', '.join(sorted(services)) or 'none'}"
            )
        image = services[service].get("image")
        if image:
            images.add(str(image))
    return images


def create_compose_networks(
    compose_argv: Sequence[str], service: str, root: str, environment: dict[str, str]
) -> None:
    """Let compose create the project's networks once, before builds run in parallel.

    Compose creates them on first use, and two first uses at once race: both
    create ``<project>_default`` and every later run finds the name ambiguous.
    """
    warm_up = ["run", "--rm", "-T", "--label", f"{RUN_LABEL}=warm-up", service, "true"]
    _compose(compose_argv, warm_up, root, environment, f"could not start {service!r}")


def _compose(
    compose_argv: Sequence[str], args: list[str], root: str, environment: dict[str, str], what: str
) -> str:
    """Run compose in the project root under a build's variables; its stdout, or an error."""
    command = " ".join([*compose_argv, *args])
    try:
        answer = subprocess.run(
            [*compose_argv, *args],
            cwd=root,
            env={**os.environ, **environment},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise FdlError(f"cannot run {command} in {root}: {exc}") from None
    if answer.returncode != 0:
        raise FdlError(
            f"{' '.join(compose_argv)} {what} in {root} (is there a compose file?): "
            + " ".join(answer.stderr.split())[-300:]
        )
    return answer.stdout


def remove_containers(*labels: str) -> int:
    """Remove every container carrying all ``labels`` (``key`` or ``key=value``); how many.

    A daemon that does not answer has none to remove.
    """
    import docker as docker_sdk

    removed = 0
    with contextlib.suppress(docker_sdk.errors.DockerException):
        client = _docker_client()
        for container in client.containers.list(all=True, filters={"label": list(labels)}):
            container.remove(force=True)
            removed += 1
        client.close()
    return removed
