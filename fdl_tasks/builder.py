"""Run build jobs on the controller: docker or native cargo, in parallel, to completion.

No early abort: a cargo cancelled mid-crate leaves a half-baked target dir,
so every job runs to its end and every failure is collected. Only the user
stops a run (Ctrl-C, SIGTERM): then every build container of the run and
every native cargo process group is stopped, and the interrupt propagates.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
from invoke.context import Context
from invoke.exceptions import CommandTimedOut

from fdl_tasks.cache import CacheStats, CompileCache, read_stats, stop_server
from fdl_tasks.commands import (
    JOB_LABEL,
    RUN_LABEL,
    compose_command,
    docker_command,
    native_command,
    native_server,
)
from fdl_tasks.console import PrefixedLines, StatusBoard
from fdl_tasks.containers import container_user, remove_containers
from fdl_tasks.errors import FdlError
from fdl_tasks.files import log_tail
from fdl_tasks.interrupts import sigterm_as_interrupt
from fdl_tasks.model import Cluster, ComposeService
from fdl_tasks.plan import BuildJob
from fdl_tasks.rules import join_path, libtorch_dir


@attrs.frozen
class JobResult:
    """How one build ended."""

    job: BuildJob
    ok: bool
    seconds: float
    detail: str = ""
    exit_code: int | None = None
    log_tail: str = ""
    cache: CacheStats | None = None


def check_cargo() -> None:
    if shutil.which("cargo") is None:
        raise FdlError(
            "cargo is not on PATH: install Rust (rustup) on the controller, or set "
            "controller.docker in cluster.yaml to build inside a container"
        )


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
        cache: CompileCache | None = None,
    ) -> None:
        self.c, self.cluster, self.run_id = c, cluster, run_id
        self.compose_argv, self.cache = compose_argv, cache
        self.timeout, self.jobs, self.board = timeout, jobs, board
        self.root = Path(cluster.controller.path)
        self._processes: dict[str, int] = {}
        self._lock = threading.Lock()

    def command(self, job: BuildJob) -> str:
        controller = self.cluster.controller
        docker, cache, run_id = controller.docker, self.cache, self.run_id
        if docker is None:
            return native_command(job, controller, cache, run_id)
        if isinstance(docker, ComposeService):
            ids = (os.geteuid(), os.getegid())
            return compose_command(job, controller, docker, self.compose_argv, run_id, ids, cache)
        return docker_command(job, controller, docker, run_id, container_user(), cache)

    def run_all(self, jobs: Sequence[BuildJob]) -> list[JobResult]:
        """Every job to its end; on an interrupt, stop them all and re-raise.

        With the compile cache the first build runs alone: builds started
        together would find the cache empty and share nothing.
        """
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.jobs, len(jobs))))
        first = 1 if self.cache and len(jobs) > 1 else 0
        try:
            with sigterm_as_interrupt():
                results = [self.run_one(job) for job in jobs[:first]]
                futures = [pool.submit(self.run_one, job) for job in jobs[first:]]
                results += [future.result() for future in futures]
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            self.stop()
            raise
        pool.shutdown()
        return results

    def stop(self) -> None:
        """Stop every build this run started: cargo process groups and containers."""
        with self._lock:
            names, groups = list(self._processes), list(self._processes.values())
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGTERM)
        if self.cluster.controller.docker:
            remove_containers(f"{RUN_LABEL}={self.run_id}")
        elif self.cache:
            for name in names:
                stop_server(self.cache, native_server(self.run_id, name))

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
            group = promise.runner.process.pid
            with self._lock:
                self._processes[job.name] = group
            # Invoke's own timeout kills the shell only, then waits for output
            # that cargo, still running, holds open: stop the whole job instead.
            expired = threading.Event()
            deadline = threading.Timer(self.timeout, self._expire, (job, group, expired))
            deadline.start()
            try:
                exit_code: int | None = promise.join().exited
            except CommandTimedOut:
                exit_code = None
            finally:
                deadline.cancel()
                with self._lock:
                    self._processes.pop(job.name, None)
            stream.close_line()
        seconds = time.monotonic() - started
        if exit_code is None or expired.is_set():
            return JobResult(
                job, False, seconds, f"timed out after {self.timeout:g}s", None, log_tail(log_path)
            )
        if exit_code != 0:
            return JobResult(
                job, False, seconds, f"cargo exited {exit_code}", exit_code, log_tail(log_path)
            )
        return self._deliver(job, seconds)

    def _expire(self, job: BuildJob, group: int, expired: threading.Event) -> None:
        expired.set()
        self._stop_job(job, group)

    def _stop_job(self, job: BuildJob, group: int) -> None:
        """A timed-out build: its container, or its whole cargo process group (and its
        compile cache server, which runs in a session of its own)."""
        if self.cluster.controller.docker:
            remove_containers(f"{RUN_LABEL}={self.run_id}", f"{JOB_LABEL}={job.name}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        if self.cache and not self.cluster.controller.docker:
            stop_server(self.cache, native_server(self.run_id, job.name))

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
                log_tail(self.root / job.log_file),
            )
        for host in job.hosts:
            destination = self.root / job.host_binary(host)
            if destination != built:
                destination.parent.mkdir(parents=True, exist_ok=True)
                partial = destination.with_name(f".{destination.name}.partial")
                shutil.copy2(built, partial)
                os.replace(partial, destination)
        stats = read_stats(self.root / job.target_dir) if self.cache else None
        return JobResult(job, True, seconds, cache=stats)


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
