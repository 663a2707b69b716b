"""The Docker side of builds, through the Engine API and the compose CLI.

Everything here is checked or cleaned before or after the builds themselves:
the daemon and the images, compose and its service, container removal.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from fdl_tasks.build.build_argv import RUN_LABEL
from fdl_tasks.build.docker_api import DockerApi, DockerError, container_name, labels_of
from fdl_tasks.core.errors import FdlError

#: The labels compose puts on each network it creates: the project's name, the network's key.
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_NETWORK_LABEL = "com.docker.compose.network"


def check_docker(images: Iterable[str], configured: str, source: str) -> dict[str, str]:
    """Before any build: the daemon answers and every image exists locally; each image's
    content id (what a build record keeps of its toolchain)."""
    docker = DockerApi()
    try:
        docker.ping()
    except DockerError as exc:
        raise FdlError(
            f"the Docker daemon does not answer ({exc}); start it, or remove "
            f"controller.docker from {source} to build with native cargo"
        ) from None
    missing, ids = [], {}
    for image in sorted(set(images)):
        try:
            found = docker.image(image)
        except DockerError as exc:
            raise FdlError(f"the Docker daemon refused to look up image {image!r}: {exc}") from None
        if found is None:
            missing.append(image)
        else:
            ids[image] = str(found["Id"])
    if missing:
        raise FdlError(
            f"Docker image(s) not found on this machine: {', '.join(missing)} "
            f"({configured}); build or pull them first"
        )
    return ids


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


def compose_configs(
    compose_argv: Sequence[str],
    service: str,
    root: str,
    environments: Iterable[dict[str, str]],
    source: str,
) -> list[dict[str, Any]]:
    """The configuration under each distinct set of variables, in order; the service must
    exist in each. ``docker compose config`` interpolates the file exactly as ``run`` will."""
    configs = []
    for environment in dict.fromkeys(tuple(sorted(e.items())) for e in environments):
        answer = _compose(compose_argv, ["config"], root, dict(environment), "config failed")
        config = yaml.safe_load(answer) or {}
        services = config.get("services") or {}
        if service not in services:
            raise FdlError(
                f"{source} names the compose service {service!r}, but the "
                f"compose file in {root} defines only: {', '.join(sorted(services)) or 'none'}"
            )
        configs.append(config)
    return configs


def service_images(configs: Iterable[Mapping[str, Any]], service: str) -> set[str]:
    """The images ``service`` resolves to across ``configs``."""
    images = (config["services"][service].get("image") for config in configs)
    return {str(image) for image in images if image}


def create_compose_networks(
    compose_argv: Sequence[str],
    service: str,
    root: str,
    environment: dict[str, str],
    config: Mapping[str, Any],
) -> None:
    """Let compose create the project's networks once, before builds run in parallel.

    Compose creates them on first use, and two first uses at once race: both
    create ``<project>_default`` and every later run finds the name ambiguous.
    The warm-up container that does it (about a second) runs only when one of
    the service's networks does not exist yet, looked up by compose's own
    labels; an existing network is never created again, so nothing can race.
    """
    project = compose_project_name(config, root, environment)
    if not _missing_networks(project, service_networks(config, service)):
        return
    warm_up = ["run", "--rm", "-T", "--label", f"{RUN_LABEL}=warm-up", service, "true"]
    _compose(compose_argv, warm_up, root, environment, f"could not start {service!r}")


def compose_project_name(
    config: Mapping[str, Any], root: str, environment: Mapping[str, str]
) -> str:
    """The project name as compose computes it: the configuration's ``name`` (compose v2
    prints it), else ``COMPOSE_PROJECT_NAME``, else the project directory's name; lower
    case, only ``a-z0-9_-``, no leading ``_`` or ``-``."""
    given = (
        config.get("name")
        or environment.get("COMPOSE_PROJECT_NAME")
        or os.environ.get("COMPOSE_PROJECT_NAME")
        or os.path.basename(os.path.abspath(root))
    )
    return re.sub(r"[^a-z0-9_-]", "", str(given).lower()).lstrip("_-")


def service_networks(config: Mapping[str, Any], service: str) -> set[str]:
    """The networks compose creates for ``service``: those it names (``default`` when it
    names none), none under a ``network_mode``; an external one is not compose's to create."""
    entry = (config.get("services") or {}).get(service) or {}
    if entry.get("network_mode"):
        return set()
    declared = entry.get("networks") or ["default"]
    top = config.get("networks") or {}
    return {str(n) for n in declared if not (top.get(n) or {}).get("external")}


def _missing_networks(project: str, networks: set[str]) -> set[str]:
    """Which of the project's ``networks`` do not exist (all of them when Docker cannot say)."""
    if not networks:
        return set()
    try:
        found = DockerApi().networks([f"{COMPOSE_PROJECT_LABEL}={project}"])
    except DockerError:
        return networks
    return networks - {labels_of(n).get(COMPOSE_NETWORK_LABEL) for n in found}


def _compose(
    compose_argv: Sequence[str], args: list[str], root: str, environment: dict[str, str], what: str
) -> str:
    """Run compose in the project root under a build's variables; its stdout, or an error."""
    shown = " ".join([*compose_argv, *args])
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
        raise FdlError(f"cannot run {shown} in {root}: {exc}") from None
    if answer.returncode != 0:
        raise FdlError(
            f"{' '.join(compose_argv)} {what} in {root} (is there a compose file?): "
            + " ".join(answer.stderr.split())[-300:]
        )
    return answer.stdout


def remove_containers(*labels: str) -> list[str]:
    """Remove every container carrying all ``labels`` (``key`` or ``key=value``).

    What could not be removed, one line each naming it, why, and the command
    that removes it; a daemon that does not answer is one such line, since
    containers it cannot list may still run.
    """
    docker = DockerApi()
    filters = " ".join(f"--filter label={shlex.quote(label)}" for label in labels)
    try:
        found = docker.containers(labels)
    except DockerError as exc:
        return [
            f"containers labelled {' '.join(labels)} may be left: the Docker daemon did not "
            f"list them ({one_line(exc)}); remove them with "
            f"docker rm -f $(docker ps -aq {filters})"
        ]
    left = []
    for container in found:
        name = container_name(container)
        try:
            docker.remove_container(name)  # one gone meanwhile (its client's --rm) is no error
        except DockerError as exc:
            left.append(
                f"container {name} could not be removed ({one_line(exc)}); "
                f"remove it with docker rm -f {name}"
            )
    return left


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def user_ids() -> tuple[int, int]:
    """The invoking user's uid and gid: files a container writes on the shared mount
    must be theirs, not root's."""
    return os.geteuid(), os.getegid()
