"""Warm build containers on this machine's Docker: found, made, replaced, stopped.

Thin I/O over :mod:`fdl_tasks.build.warm_containers`. Containers are looked up
through the Engine API (:mod:`~fdl_tasks.build.docker_api`); they are
made with the ``docker`` client itself, from the very options a ``docker run``
build would get, so nothing is translated. Which container each job used last
is a small file under ``target/cluster/_warm/``: a container gone before its idle
timeout (a daemon restart, a removal by hand) is then said, not silently remade.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.build.docker_api import DockerApi, DockerError, container_name, labels_of
from fdl_tasks.build.docker_tools import one_line, remove_containers
from fdl_tasks.build.parked_standbys import park_dir
from fdl_tasks.build.warm_containers import (
    KILL_BUILDS,
    PARK_MOUNT,
    WARM_IMAGE_LABEL,
    WARM_JOB_LABEL,
    WARM_LABEL,
    Start,
    WarmSettings,
    bind_sources,
    client_variables,
    cold_reason,
    exec_argv,
    exec_line,
    gone_reason,
    identity,
    keeper_argv,
    run_start,
    running,
    spec_digest,
    standby_line,
    warm_name,
)
from fdl_tasks.config.layout import WARM_DIR
from fdl_tasks.config.run import Run
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.reporting import Report, Severity
from fdl_tasks.core.standbys import Offer, Standbys

#: The shortest idle timeout: a container must outlive the moment between its start and
#: its first build's ``docker exec``, however loaded the machine.
MIN_IDLE = 10
#: Seconds a ``docker`` client call may take here (a start, a kill).
DOCKER_TIMEOUT = 60


def start_inputs(options: Sequence[str]) -> list[str]:
    """What a ``docker run`` with ``options`` reads when it starts and a running container
    would not see change: each bind source's device and inode (a directory replaced by
    another at its path), what is mounted under one (``/proc/self/mountinfo``), an env
    file's text, the client's value of each ``-e NAME``."""
    sources = bind_sources(options)
    seen = []
    for source in sources:
        try:
            stat = os.stat(source)
            seen.append(f"{source} {stat.st_dev}:{stat.st_ino}")
        except OSError:
            seen.append(f"{source} absent")
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split(" ")[4] if line.count(" ") > 4 else ""
            if any(point.startswith(s.rstrip("/") + "/") for s in sources):
                seen.append(f"mounted {point}")
    for env_file in bind_sources(options, env_files=True):
        with contextlib.suppress(OSError):
            seen.append(Path(env_file).read_text(errors="replace"))
    seen += [f"{name}={os.environ.get(name, '')}" for name in client_variables(options)]
    return seen


def run_warm(run: Run) -> WarmContainers | None:
    """The run's warm containers: ``fdl.warm_containers`` on (``--no-warm`` turns it off),
    none under ``inv --dry`` (it prints the ``docker run`` of each build)."""
    settings = run.settings
    if run.dry or not settings.warm_containers:
        return None
    idle = max(MIN_IDLE, int(settings.warm_idle))
    return WarmContainers(str(run.root), WarmSettings(idle), run.say, run.standbys)


class WarmContainers:
    """One run's warm containers: each job's found or made before its build, and the
    builds in them stopped on a timeout or a stop. With ``standbys`` (a ``--watch``
    session's), each build may run in a ``docker exec`` already waiting in its container."""

    def __init__(
        self, root: str, settings: WarmSettings, say: Report, standbys: Standbys | None = None
    ) -> None:
        self.root, self.settings, self.say, self.standbys = root, settings, say, standbys
        #: Job name → the container its build runs in; those a standby may be parked in.
        self.used: dict[str, str] = {}
        self.parkable: set[str] = set()
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._entrypoints: dict[str, str | None] = {}
        self.docker = DockerApi()

    def container_for(
        self,
        job: str,
        image: str,
        image_id: str | None,
        options: Sequence[str],
        start: Start | None = None,
    ) -> str | None:
        """The running container this job's build is ``docker exec``'d in, made if need be;
        ``None`` when the build must run in a container of its own (said once why)."""
        why = cold_reason(options) if image_id else "its image's id is not known"
        if why or image_id is None:
            self._say_once(f"{image}: builds run in a container each (not warm): {why}")
            return None
        name = self._name(image_id, options)
        try:
            if entrypoint := self._entrypoint(image_id):
                self._say_once(
                    f"{image}: builds run in a container each (not warm): the image has an "
                    f"entrypoint ({textwrap.shorten(entrypoint, 60)}), which docker exec would skip"
                )
                return None
            self._ensure(job, name, image_id, start or run_start(options))
        except Exception as exc:  # the daemon's failure: the build says it as docker run would
            self._say_once(
                f"{job}: no warm build container ({one_line(exc)}): a container of its own"
            )
            return None
        with self._lock:
            self.used[job] = name
            if any(option.endswith(f":{PARK_MOUNT}") for option in options):
                self.parkable.add(name)
        return name

    def stand_by(self, image_id: str | None, options: Sequence[str]) -> None:
        """A standby (:mod:`fdl_tasks.core.standbys`) in the container :meth:`container_for`
        will choose, if it runs; beside preflight, so nothing is made, replaced or said."""
        if self.standbys is None or image_id is None or cold_reason(options):
            return
        name = self._name(image_id, options)
        try:
            found = self.docker.container(name)
        except DockerError:  # the build finds out, and says so
            return
        if running(found):
            self.standbys.ahead(name, standby_line(name))

    def _name(self, image_id: str, options: Sequence[str]) -> str:
        return warm_name(spec_digest(self.root, image_id, options, start_inputs(options)))

    def exec_line(self, name: str, command: Sequence[str]) -> str:
        """The build's ``docker exec`` in container ``name``, offered to the standbys."""
        line = exec_line(name, command)
        if self.standbys is not None:
            text = shlex.join(exec_argv(command))
            offer = Offer(name, standby_line(name), text, name in self.parkable)
            self.standbys.offer(line, offer)
        return line

    def _ensure(self, job: str, name: str, image_id: str, start: Start) -> None:
        state = Path(self.root) / WARM_DIR / job.replace("/", "-").lstrip("_")
        last, last_used = _last_container(state)
        found = self.docker.container(name)
        if running(found):
            _touch(state, name)
            return
        if found is not None:
            with contextlib.suppress(DockerError):
                self.docker.remove_container(name)
        if last == name and (why := gone_reason(last_used, time.time(), self.settings)):
            was = "stopped" if found is not None else "gone"
            self.say(
                f"build container {name} of {job} is {was} ({why}): starting a new one",
                Severity.WARNING,
            )
        old = self.docker.containers([f"{WARM_LABEL}={self.root}", f"{WARM_JOB_LABEL}={job}"])
        for container in (c for c in old if container_name(c) != name):
            changed = labels_of(container).get(WARM_IMAGE_LABEL) != image_id
            what = "its image" if changed else "its mounts, environment or settings"
            self.say(f"replacing the build container of {job}: {what} changed")
            with contextlib.suppress(DockerError):
                self.docker.remove_container(container_name(container))
        shutil.rmtree(park_dir(self.root) / name, ignore_errors=True)  # its shell is gone
        line = start(identity(name, self.root, job, image_id), keeper_argv(self.settings))
        made = subprocess.run(
            line,
            shell=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT,
            check=False,
        )
        if made.returncode != 0 and "is already in use" not in made.stderr:
            raise OSError(made.stderr.strip().splitlines()[-1] if made.stderr.strip() else "")
        _touch(state, name)

    def _entrypoint(self, image_id: str) -> str | None:
        """The image's entrypoint, asked once per image and run."""
        if image_id not in self._entrypoints:
            config = (self.docker.image(image_id) or {}).get("Config") or {}
            entrypoint = config.get("Entrypoint")
            self._entrypoints[image_id] = " ".join(entrypoint) if entrypoint else None
        return self._entrypoints[image_id]

    def _say_once(self, line: str) -> None:
        with self._lock:
            if line in self._said:
                return
            self._said.add(line)
        self.say(line, Severity.WARNING)

    def stop_build(self, job: str) -> list[str]:
        """Kill the job's build inside its container (killing the ``docker exec`` client
        would leave it running there); the container is removed when that fails."""
        name = self.used.get(job)
        return [] if name is None else kill_builds(name)

    def stop_all(self) -> list[str]:
        """Every build this run started in a warm container, stopped."""
        with self._lock:
            names = sorted(set(self.used.values()))
        return [line for name in names for line in kill_builds(name)]


def kill_builds(name: str) -> list[str]:
    """Kill every process in the container but its keeper; what could not be, each a line
    naming it and the command that removes it."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["docker", "exec", "-u", "0", name, "sh", "-c", KILL_BUILDS],
            capture_output=True,
            timeout=DOCKER_TIMEOUT,
            check=False,
        )
        if done.returncode == 0 or b"No such container" in done.stderr:
            return []
        if b"is not running" in done.stderr:
            return []
    return remove_named(name)


def remove_named(name: str) -> list[str]:
    """``docker rm -f`` one container; a line naming it if that failed."""
    try:
        done = subprocess.run(
            ["docker", "rm", "-f", name],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"build container {name} could not be stopped ({exc}); docker rm -f {name}"]
    if done.returncode == 0 or "No such container" in done.stderr:
        return []
    why = " ".join(done.stderr.split())[:300]
    return [
        f"build container {name} could not be removed ({why}); remove it with docker rm -f {name}"
    ]


def remove_project_containers(root: str) -> list[str]:
    """Every warm container of the project at ``root`` removed (``inv clean``, a stop of
    ``--watch``), with the note of the one each build used last (else the next build says
    they were lost); what could not be removed, as :func:`remove_containers` says it."""
    shutil.rmtree(Path(root) / WARM_DIR, ignore_errors=True)
    return remove_containers(f"{WARM_LABEL}={root}")


def _last_container(state: Path) -> tuple[str | None, float | None]:
    try:
        return state.read_text(encoding="utf-8").strip(), state.stat().st_mtime
    except OSError:
        return None, None


def _touch(state: Path, name: str) -> None:
    """Record (or refresh) which container the job used, now."""
    with contextlib.suppress(OSError):
        if _last_container(state)[0] == name:
            os.utime(state)
            return
        state.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(state, name + "\n")
