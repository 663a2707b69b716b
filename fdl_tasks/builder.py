"""Run build jobs on the controller: docker or native cargo, in parallel, to completion.

No early abort: a cargo cancelled mid-crate leaves a half-baked target dir,
so every job runs to its end and every failure is collected. Only the user
stops a run (Ctrl-C, SIGTERM): then every build container of the run and
every native cargo process group is stopped, and the interrupt propagates.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TextIO

import attrs
import yaml
from invoke.context import Context
from invoke.exceptions import CommandTimedOut

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Cluster, ComposeService
from fdl_tasks.plan import (
    JOB_LABEL,
    RUN_LABEL,
    BuildJob,
    compose_command,
    docker_command,
    native_command,
)
from fdl_tasks.rules import join_path, libtorch_dir

LOG_TAIL_LINES = 25


class TextSink(Protocol):
    """Anything build output can be written to: a file, a terminal, the status board."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@attrs.frozen
class JobResult:
    """How one build ended."""

    job: BuildJob
    ok: bool
    seconds: float
    detail: str = ""
    exit_code: int | None = None
    log_tail: str = ""


class StatusBoard:
    """Where build output goes: plain lines, plus a live status line on a terminal.

    On a TTY the last line shows what is running (with elapsed time), done and
    failed, redrawn every half second; elsewhere (CI logs) only plain lines.
    """

    def __init__(self, stream: TextIO = sys.stderr, live: bool | None = None) -> None:
        self.stream = stream
        self.live = stream.isatty() if live is None else live
        self.lock = threading.Lock()
        self.running: dict[str, float] = {}
        self.done = self.failed = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(("\r\033[K" if self.live else "") + text)
            self._draw()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def started(self, name: str) -> None:
        with self.lock:
            self.running[name] = time.monotonic()
        if not self.live:
            self.write(f"prebuild: {name} started\n")

    def finished(self, result: JobResult) -> None:
        with self.lock:
            self.running.pop(result.job.name, None)
            if result.ok:
                self.done += 1
            else:
                self.failed += 1
        state = "ok" if result.ok else f"FAILED ({result.detail})"
        self.write(f"prebuild: {result.job.name} {state} in {result.seconds:.1f}s\n")

    def _draw(self) -> None:
        if not self.live:
            return
        now = time.monotonic()
        running = ", ".join(f"{n} {now - t:.0f}s" for n, t in self.running.items())
        self.stream.write(
            f"\r\033[K[running: {running or '-'} | done {self.done} | failed {self.failed}]"
        )
        self.stream.flush()

    def __enter__(self) -> StatusBoard:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self.lock:
                self._draw()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self.live:
            with self.lock:
                self.stream.write("\r\033[K")
                self.stream.flush()


class PrefixedLines:
    """A stream for ``c.run``: text to the log file if any, ``[name] line`` to ``echo``."""

    def __init__(self, name: str, log: TextSink | None, echo: TextSink) -> None:
        self.name, self.log, self.echo, self._pending = name, log, echo, ""

    def write(self, text: str) -> int:
        if self.log:
            self.log.write(text)
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            self.echo.write("".join(f"[{self.name}] {line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.log:
            self.log.flush()
        self.echo.flush()

    def close_line(self) -> None:
        if self._pending:
            self.write("\n")


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
    compose: ComposeService,
    root: str,
    environments: Iterable[dict[str, str]],
) -> set[str]:
    """The images the service resolves to under each build's variables; the service must exist.

    ``docker compose config`` interpolates the file exactly as ``run`` will.
    """
    images = set()
    for environment in {tuple(sorted(e.items())) for e in environments}:
        try:
            answer = subprocess.run(
                [*compose_argv, "config"],
                cwd=root,
                env={**os.environ, **dict(environment)},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise FdlError(f"cannot run {' '.join(compose_argv)} config in {root}: {exc}") from None
        if answer.returncode != 0:
            raise FdlError(
                f"{' '.join(compose_argv)} config failed in {root} (is there a compose file?): "
                + " ".join(answer.stderr.split())[-300:]
            )
        services = (yaml.safe_load(answer.stdout) or {}).get("services") or {}
        if compose.service not in services:
            raise FdlError(
                f"controller.docker names the compose service {compose.service!r}, but the "
                f"compose file in {root} defines only: {', '.join(sorted(services)) or 'none'}"
            )
        image = services[compose.service].get("image")
        if image:
            images.add(str(image))
    return images


def create_compose_networks(
    compose_argv: Sequence[str], compose: ComposeService, root: str, environment: dict[str, str]
) -> None:
    """Let compose create the project's networks once, before builds run in parallel.

    Compose creates them on first use, and two first uses at once race: both
    create ``<project>_default`` and every later run finds the name ambiguous.
    """
    argv = [*compose_argv, "run", "--rm", "-T", "--label", f"{RUN_LABEL}=warm-up"]
    try:
        answer = subprocess.run(
            [*argv, compose.service, "true"],
            cwd=root,
            env={**os.environ, **environment},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise FdlError(f"cannot run {' '.join(argv)}: {exc}") from None
    if answer.returncode != 0:
        raise FdlError(
            f"{' '.join(compose_argv)} could not start service {compose.service!r} in {root}: "
            + " ".join(answer.stderr.split())[-300:]
        )


def check_cargo() -> None:
    if shutil.which("cargo") is None:
        raise FdlError(
            "cargo is not on PATH: install Rust (rustup) on the controller, or set "
            "controller.docker in cluster.yaml to build inside a container"
        )


def remove_containers(run_id: str, job: BuildJob | None = None) -> None:
    """Remove this run's build containers (or one job's)."""
    import docker as docker_sdk

    labels = [f"{RUN_LABEL}={run_id}"] + ([f"{JOB_LABEL}={job.name}"] if job else [])
    with contextlib.suppress(docker_sdk.errors.DockerException):  # a dead daemon has none
        client = _docker_client()
        for container in client.containers.list(all=True, filters={"label": labels}):
            container.remove(force=True)
        client.close()


def container_user() -> str | None:
    """Run as the invoking user so files on the shared mount are not owned by root."""
    return None if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a prebuild exactly like Ctrl-C does."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def project_lock(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One prebuild per project tree at a time; a second one waits its turn, saying so."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.open("a+")
    except OSError as exc:
        raise FdlError(f"the target tree is not writable: cannot create {path} ({exc})") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            say(
                f"prebuild: waiting for the prebuild already running on this project "
                f"({holder}) to finish"
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        yield


class Builder:
    """Runs one prebuild's jobs, collects every result, and can stop them all."""

    def __init__(
        self,
        c: Context,
        cluster: Cluster,
        run_id: str,
        timeout: float,
        jobs: int,
        board: StatusBoard,
        compose_argv: Sequence[str] = (),
    ) -> None:
        self.c, self.cluster, self.run_id = c, cluster, run_id
        self.compose_argv = compose_argv
        self.timeout, self.jobs, self.board = timeout, jobs, board
        self.root = Path(cluster.controller.path)
        self._processes: dict[str, int] = {}
        self._lock = threading.Lock()

    def command(self, job: BuildJob) -> str:
        controller = self.cluster.controller
        if controller.docker is None:
            return native_command(job, controller)
        if isinstance(controller.docker, ComposeService):
            ids = (os.geteuid(), os.getegid())
            return compose_command(
                job, controller, controller.docker, self.compose_argv, self.run_id, ids
            )
        return docker_command(job, controller, controller.docker, self.run_id, container_user())

    def run_all(self, jobs: Sequence[BuildJob]) -> list[JobResult]:
        """Every job to its end; on an interrupt, stop them all and re-raise."""
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.jobs, len(jobs))))
        try:
            with sigterm_as_interrupt():
                futures = [pool.submit(self.run_one, job) for job in jobs]
                results = [future.result() for future in futures]
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            self.stop()
            raise
        pool.shutdown()
        return results

    def stop(self) -> None:
        """Stop every build this run started: cargo process groups and containers."""
        with self._lock:
            groups = list(self._processes.values())
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGTERM)
        if self.cluster.controller.docker:
            remove_containers(self.run_id)

    def run_one(self, job: BuildJob) -> JobResult:
        started = time.monotonic()
        lib = Path(libtorch_dir(str(self.root), job.spec.arch)) / "lib"
        if not lib.is_dir():
            result = JobResult(job, False, 0.0, f"libtorch not found: {lib} is not a directory")
            self.board.finished(result)
            return result
        self.board.started(job.name)
        try:
            result = self._build(job, started)
        except OSError as exc:
            result = JobResult(
                job,
                False,
                time.monotonic() - started,
                f"cannot write under {self.root / job.target_dir}: {exc}",
            )
        self.board.finished(result)
        return result

    def _claim_target_dir(self, job: BuildJob) -> None:
        """Record the arch a target dir is for; a different arch with the same slug
        (``a/b-c`` and ``a-b/c``) wipes it, since cargo cannot see the swap in Docker."""
        target = self.root / job.target_dir
        marker = target / ".fdl-arch"
        if marker.is_file() and marker.read_text(encoding="utf-8") != job.spec.arch:
            shutil.rmtree(target)
        target.mkdir(parents=True, exist_ok=True)
        marker.write_text(job.spec.arch, encoding="utf-8")

    def _build(self, job: BuildJob, started: float) -> JobResult:
        self._claim_target_dir(job)
        log_path = self.root / job.log_file
        with log_path.open("w", encoding="utf-8") as log:
            stream = PrefixedLines(job.name, log, self.board)
            promise: Any = self.c.run(
                self.command(job),
                asynchronous=True,
                warn=True,
                hide=False,
                pty=False,
                out_stream=stream,
                err_stream=stream,
                timeout=self.timeout,
            )
            with self._lock:
                self._processes[job.name] = promise.runner.process.pid
            try:
                exit_code: int | None = promise.join().exited
            except CommandTimedOut:
                exit_code = None
                self._stop_job(job, promise.runner.process.pid)
            finally:
                with self._lock:
                    self._processes.pop(job.name, None)
            stream.close_line()
        seconds = time.monotonic() - started
        if exit_code is None:
            return JobResult(
                job, False, seconds, f"timed out after {self.timeout:g}s", None, _tail(log_path)
            )
        if exit_code != 0:
            return JobResult(
                job, False, seconds, f"cargo exited {exit_code}", exit_code, _tail(log_path)
            )
        return self._deliver(job, seconds)

    def _stop_job(self, job: BuildJob, group: int) -> None:
        """A timed-out build: its container, or its whole cargo process group."""
        if self.cluster.controller.docker:
            remove_containers(self.run_id, job)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)

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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        raise FdlError(f"cannot write {path}: {exc}") from None
