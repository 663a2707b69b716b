"""Run build jobs on the controller: docker or native cargo, in parallel, to completion.

Builds are ``c.run`` calls, so ``inv --dry`` prints them and runs nothing.
No early abort: a cargo cancelled mid-crate leaves a half-baked target dir,
so every job runs to its end and every failure is collected.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import attrs
from invoke.context import Context
from invoke.exceptions import CommandTimedOut

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Cluster, DockerSettings
from fdl_tasks.plan import RUN_LABEL, BuildJob, docker_command, native_command
from fdl_tasks.rules import join_path, libtorch_dir

LOG_TAIL_LINES = 25


@attrs.frozen
class JobResult:
    """How one build ended."""

    job: BuildJob
    ok: bool
    seconds: float
    detail: str = ""
    exit_code: int | None = None
    log_tail: str = ""


class PrefixedLines:
    """A stream for ``c.run``: text to the log file if any, ``[name] line`` to ``echo``."""

    _echo_lock = threading.Lock()

    def __init__(self, name: str, log: TextIO | None, echo: TextIO) -> None:
        self.name, self.log, self.echo, self._pending = name, log, echo, ""

    def write(self, text: str) -> int:
        if self.log:
            self.log.write(text)
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            with self._echo_lock:
                self.echo.write("".join(f"[{self.name}] {line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.log:
            self.log.flush()
        self.echo.flush()

    def close_line(self) -> None:
        if self._pending:
            self.write("\n")


def check_docker(docker: DockerSettings, images: Iterable[str]) -> None:
    """Before any build: the daemon answers and every image exists locally."""
    import docker as docker_sdk

    try:
        client = docker_sdk.from_env(version="auto", timeout=10)
        client.ping()
    except docker_sdk.errors.DockerException as exc:
        raise FdlError(
            f"the Docker daemon does not answer ({exc}); start it, or remove "
            "controller.docker from cluster.yaml to build with native cargo"
        ) from None
    missing = []
    for image in sorted(set(images)):
        try:
            client.images.get(image)
        except docker_sdk.errors.ImageNotFound:
            missing.append(image)
    client.close()
    if missing:
        raise FdlError(
            f"Docker image(s) not found on this machine: {', '.join(missing)} "
            f"(controller.docker.image is {docker.image!r}); build or pull them first"
        )


def check_cargo() -> None:
    if shutil.which("cargo") is None:
        raise FdlError(
            "cargo is not on PATH: install Rust (rustup) on the controller, or set "
            "controller.docker in cluster.yaml to build inside a container"
        )


def stop_containers(run_id: str) -> int:
    """Stop and remove every build container this run started; returns how many."""
    import docker as docker_sdk

    try:
        client = docker_sdk.from_env(version="auto", timeout=10)
        found = client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})
        for container in found:
            container.remove(force=True)
        client.close()
    except docker_sdk.errors.DockerException:
        return 0
    return len(found)


def container_user() -> str | None:
    """Run as the invoking user so files on the shared mount are not owned by root."""
    return None if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}"


class Builder:
    """Runs one prebuild's jobs and collects every result."""

    def __init__(
        self,
        c: Context,
        cluster: Cluster,
        run_id: str,
        timeout: float,
        jobs: int,
        echo: TextIO = sys.stderr,
    ) -> None:
        self.c, self.cluster, self.run_id = c, cluster, run_id
        self.timeout, self.jobs, self.echo = timeout, jobs, echo
        self.root = Path(cluster.controller.path)

    def command(self, job: BuildJob) -> str:
        docker = self.cluster.controller.docker
        if docker is None:
            return native_command(job, self.cluster.controller)
        return docker_command(job, self.cluster.controller, docker, self.run_id, container_user())

    def run_all(
        self, jobs: Sequence[BuildJob], on_done: Callable[[JobResult], None]
    ) -> list[JobResult]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.jobs, len(jobs)))) as pool:
            futures = [pool.submit(self.run_one, job) for job in jobs]
            results = []
            for future in futures:
                result = future.result()
                on_done(result)
                results.append(result)
        return results

    def run_one(self, job: BuildJob) -> JobResult:
        started = time.monotonic()
        lib = Path(libtorch_dir(str(self.root), job.spec.arch)) / "lib"
        if not lib.is_dir():
            return JobResult(job, False, 0.0, f"libtorch not found: {lib} is not a directory")
        log_path = self.root / job.log_file
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w", encoding="utf-8") as log:
            stream = PrefixedLines(job.name, log, self.echo)
            try:
                result: Any = self.c.run(
                    self.command(job),
                    warn=True,
                    hide=False,
                    pty=False,
                    in_stream=False,
                    out_stream=stream,
                    err_stream=stream,
                    timeout=self.timeout,
                )
                exit_code, timed_out = result.exited, False
            except CommandTimedOut:
                exit_code, timed_out = None, True
            stream.close_line()
        seconds = time.monotonic() - started
        if timed_out:
            stop_containers(self.run_id) if self.cluster.controller.docker else None
            return JobResult(
                job, False, seconds, f"timed out after {self.timeout:g}s", None, _tail(log_path)
            )
        if exit_code != 0:
            return JobResult(
                job, False, seconds, f"cargo exited {exit_code}", exit_code, _tail(log_path)
            )
        return self._deliver(job, seconds)

    def _deliver(self, job: BuildJob, seconds: float) -> JobResult:
        """Place the binary at each host's own path (atomically) when the build was shared."""
        built = self.root / job.built_binary
        if not built.is_file():
            return JobResult(
                job,
                False,
                seconds,
                f"cargo succeeded but {built} is missing",
                0,
                _tail(self.root / job.log_file),
            )
        for host in job.hosts:
            destination = self.root / job.host_binary(host)
            if destination != built:
                destination.parent.mkdir(parents=True, exist_ok=True)
                partial = destination.with_name(f".{destination.name}.partial")
                shutil.copy2(built, partial)
                os.replace(partial, destination)
        return JobResult(job, True, seconds)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def failure_report(result: JobResult, cluster: Cluster) -> str:
    """Everything needed to fix one failed build, in one place."""
    job, root = result.job, cluster.controller.path
    lines = [
        f"build {job.name} for {', '.join(job.hosts)} failed: {result.detail}",
        f"  exit code:  {result.exit_code if result.exit_code is not None else '-'}",
        f"  libtorch:   {libtorch_dir(root, job.spec.arch)}",
        f"  target dir: {join_path(root, job.target_dir)}",
        f"  features:   {','.join(job.spec.features) or '(none)'}",
        f"  log:        {join_path(root, job.log_file)}",
    ]
    if result.log_tail:
        lines.append("  last lines of the log:")
        lines += [f"    {line}" for line in result.log_tail.splitlines()]
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
