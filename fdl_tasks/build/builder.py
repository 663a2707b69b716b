"""Run build jobs on the controller, in parallel, each to its end.

No early abort: a cargo cancelled mid-crate leaves a half-baked target dir,
so every job runs to its end and every failure is collected. Only the user
stops a run (Ctrl-C, SIGTERM): then the backend stops every build of the run
and the interrupt propagates. How a build runs and stops is the backend's
(:mod:`fdl_tasks.build.backends`); this module only schedules, times and collects.
"""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import attrs
from invoke.context import Context

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_order import head_start
from fdl_tasks.build.build_record import BuildRecord, forced_line, tree_digest
from fdl_tasks.build.build_record_io import Records
from fdl_tasks.build.build_results import JobResult
from fdl_tasks.build.build_view import last_run_seconds, ran_line, standby_lost_line
from fdl_tasks.build.build_view_io import BuildView
from fdl_tasks.cache.cache_stats import read_stats
from fdl_tasks.cargo.manifests import changed_since
from fdl_tasks.config.layout import MARKER_FILE
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.core.atomic_files import SECOND_NS, copy_atomically, log_tail
from fdl_tasks.core.binary_files import BinaryFacts, file_sha256, readable_facts
from fdl_tasks.core.interrupts import sigterm_as_interrupt
from fdl_tasks.core.standbys import Running, Spawned, Standbys, run_in_background

#: What the board says of a build whose record shows nothing changed.
UNCHANGED = "unchanged since its last build: cargo not started"


class Builder:
    """Runs one prebuild's jobs through the run's backend, collects every result.

    ``jobs`` is how many run at once (:func:`concurrency`); with ``records``, a unit
    that read a file changed by content is rebuilt whatever its mtimes say, and a build
    whose inputs are unchanged since it last succeeded starts no cargo at all.
    ``on_built`` is handed each build that ended well, as it ends.
    """

    def __init__(
        self,
        c: Context,
        root: Path,
        backend: Backend,
        *,
        timeout: float,
        jobs: int,
        view: BuildView,
        records: Records | None = None,
        standbys: Standbys | None = None,
        on_built: Callable[[JobResult], object] | None = None,
    ) -> None:
        self.c, self.root, self.backend, self.cache = c, root, backend, backend.cache
        self.timeout, self.jobs, self.view, self.records = timeout, jobs, view, records
        self.standbys, self.on_built = standbys, on_built
        self._processes: dict[str, tuple[BuildJob, int | None]] = {}
        self._lock = threading.Lock()
        #: Writes each successful build's record while the run goes on.
        self._recorder = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="record")
        #: What a stop or a timeout could not remove, each line with the command that does.
        self.left_running: list[str] = []
        self.stopping = threading.Event()  #: set by :meth:`stop`

    def head_start(self, jobs: Sequence[BuildJob]) -> tuple[int, bool]:
        """(how many builds run before the others start, whether because the dependencies
        changed) for :meth:`run_all` and the line that says so.

        With the compile cache and no target dir built yet, or the dependencies
        changed since the last builds, the first build runs alone: builds started
        together would find the cache empty and share nothing. Otherwise (an edit
        of the workspace's own code) the head start would only cost time.
        """
        markers = [self.root / job.target_dir / MARKER_FILE for job in jobs]
        cold = not any(marker.exists() for marker in markers)
        cached = self.cache is not None
        changed = (
            cached
            and not cold
            and len(jobs) > 1
            and changed_since({self.root / job.build.crate_dir for job in jobs}, markers)
        )
        first = head_start(cached=cached, cold=cold, builds=len(jobs), dependencies=changed)
        return first, changed

    def run_all(self, jobs: Sequence[BuildJob], first: int) -> list[JobResult]:
        """Every job to its end, the ``first`` ones (:meth:`head_start`) alone before the
        others; on an interrupt, stop them all and re-raise."""
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.jobs, len(jobs))))
        futures: list[Future[JobResult]] = []
        try:
            with sigterm_as_interrupt():
                results = [self.run_one(job) for job in jobs[:first]]
                futures = [pool.submit(self.run_one, job) for job in jobs[first:]]
                results += [future.result() for future in futures]
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            self.stop()
            wait(futures, timeout=5)  # up to 5 s for their "stopped" lines before the last word
            self._recorder.shutdown()  # the records of builds that ended well, written
            raise
        pool.shutdown()
        self._recorder.shutdown(wait=False)  # nothing more to record: its threads end
        return results

    def stop(self) -> None:
        """Stop every build this run started; what could not be is in :attr:`left_running`."""
        self.stopping.set()
        with self._lock:
            running = list(self._processes.values())
        left = [line for job, process in running for line in self.backend.stop_job(job, process)]
        self._left(left + self.backend.stop_run())

    def _left(self, lines: Sequence[str]) -> None:
        with self._lock:
            self.left_running += [line for line in lines if line not in self.left_running]

    def run_one(self, job: BuildJob) -> JobResult:
        started = time.monotonic()
        lib = Path(libtorch_dir(str(self.root), job.build.arch)) / "lib"
        if not lib.is_dir():
            detail = f"libtorch not found: {lib} is not a directory"
            result = JobResult(job=job, ok=False, seconds=0.0, detail=detail)
        else:
            self.view.started(job, last_run_seconds(log_tail(self.root / job.log_file, 1)))
            try:
                result = self._build(job, started)
            except OSError as exc:
                detail = f"cannot write under {self.root / job.target_dir}: {exc}"
                if exc.errno == errno.ENOSPC:
                    detail += f": the disk holding {self.root / job.target_dir} is full"
                result = JobResult(
                    job=job, ok=False, seconds=time.monotonic() - started, detail=detail
                )
        stopped = not result.ok and self.stopping.is_set()  # by the user: not a failure
        self.view.finished(
            job, ok=result.ok, seconds=result.seconds, detail=result.detail, stopped=stopped
        )
        result = attrs.evolve(result, started=started)
        if result.ok and self.on_built is not None:
            self.on_built(result)
        return result

    def _claim_target_dir(self, job: BuildJob) -> None:
        """Record what a target dir is for; a per-host dir whose arch differs under the
        same slug (``a/b-c`` and ``a-b/c``) is wiped, since cargo cannot see the swap."""
        target = self.root / job.target_dir
        marker = target / MARKER_FILE
        key = job.build.environment.key
        if marker.is_file() and _marked_arch(marker) != key.arch:
            shutil.rmtree(target)
        target.mkdir(parents=True, exist_ok=True)
        marker.write_text(key.marker(), encoding="utf-8")

    def _build(self, job: BuildJob, started: float) -> JobResult:
        self._claim_target_dir(job)
        built = self.root / job.built_binary
        check = self.records.check(job) if self.records else None
        if check and check.verdict.fresh:
            record = check.record
            facts, tree = (record.built, tree_digest(record)) if record else (None, "")
            return self._succeeded(job, started, facts, tree=tree, rebuilt=False, skipped=True)
        before = _binary_state(built)
        log_path = self.root / job.log_file
        with log_path.open("w", encoding="utf-8") as log:
            stream = self.view.output(job, log)
            if check and check.verdict.forced:
                stream.write(forced_line(check.verdict, self.root) + "\n")
            line = self.backend.build_line(job)
            # A docker exec that waits for this build already, if one does (core/standbys.py).
            handed = self.standbys.start(line, stream) if self.standbys else None
            # One clock per build; the backend stops the whole build when it runs out
            # (killing the shell alone would leave cargo or the container running).
            expired = threading.Event()
            deadline = threading.Timer(self.timeout, self._expire, (job, expired))
            deadline.start()
            try:
                running = handed.running if handed else self._spawned(line, stream)
                exit_code = self._joined(job, running)
                stopped = expired.is_set() or self.stopping.is_set()
                if handed and exit_code and not handed.began() and not stopped:
                    stream.write(standby_lost_line(handed.key, exit_code) + "\n")
                    line = self.backend.build_line(job)
                    exit_code = self._joined(job, self._spawned(line, stream))
            finally:
                deadline.cancel()
            stream.close()
            seconds = time.monotonic() - started
            log.write(ran_line(seconds, exit_code) + "\n")
        problem = None
        if expired.is_set():
            problem = f"timed out after {self.timeout:g}s"
        elif exit_code != 0:
            said = self.backend.exit_problem(exit_code, log_tail(log_path))
            problem = said or f"cargo exited {exit_code}"
            if signal_name := {128 + 9: "SIGKILL", 128 + 15: "SIGTERM"}.get(exit_code):
                problem += f" (killed by {signal_name}: {self.backend.killers})"
        elif not built.is_file():
            problem = f"cargo succeeded but {built} is missing"
        if problem:
            tail = log_tail(log_path)
            if "No space left on device" in tail:
                problem += f": the disk holding {self.root / job.target_dir} is full"
            code = None if expired.is_set() else exit_code
            return JobResult(
                job=job, ok=False, seconds=seconds, detail=problem, exit_code=code, log_tail=tail
            )
        rebuilt = _binary_state(built) != before
        facts = readable_facts(built)  # verification compares with them; the record keeps them
        if not (self.records and check):
            return self._succeeded(job, started, facts, rebuilt=rebuilt)
        recording = self._recorder.submit(self.records.record, job, check, facts)
        return self._succeeded(job, started, facts, rebuilt=rebuilt, recording=recording)

    def _succeeded(
        self,
        job: BuildJob,
        started: float,
        facts: BinaryFacts | None,
        *,
        rebuilt: bool,
        skipped: bool = False,
        tree: str = "",
        recording: Future[BuildRecord | None] | None = None,
    ) -> JobResult:
        """A build that left its binary (``skipped``: cargo was not needed): each own-dir
        host's copy, the binary's hash (``facts``' when known: a fresh record's binary has
        its stat), the tree its record says it was built from, or the record on its way."""
        built = self.root / job.built_binary
        for host in job.hosts:
            destination = self.root / job.host_binary(host)
            if destination != built:
                copy_atomically(built, destination)
        return JobResult(
            job=job,
            ok=True,
            seconds=time.monotonic() - started,
            detail=UNCHANGED if skipped else "",
            cache=read_stats(self.root / job.target_dir) if self.cache and not skipped else None,
            rebuilt=rebuilt,
            sha256=facts.sha256 if facts else file_sha256(built),
            tree=tree,
            facts=facts,
            recording=recording,
        )

    def _spawned(self, line: str, stream: Any) -> Running:
        return Spawned(run_in_background(self.c, line, stream))

    def _joined(self, job: BuildJob, running: Running) -> int:
        """The exit status of ``job``'s running build, which a stop may kill meanwhile."""
        with self._lock:
            self._processes[job.name] = (job, running.pid)
        try:
            return running.wait()
        finally:
            with self._lock:
                self._processes.pop(job.name, None)

    def _expire(self, job: BuildJob, expired: threading.Event) -> None:
        expired.set()
        with self._lock:
            process = self._processes.get(job.name, (job, None))[1]
        self._left(self.backend.stop_job(job, process))


def _binary_state(path: Path) -> tuple[int, int, str] | None:
    """Size, modification time and, when that time is in whole seconds, the sha256: cargo
    rewrites a binary only when it relinks it, and on such a mount (SSHFS) a relink in
    the second of the last one, at the same size, shows the same stat."""
    try:
        stat = path.stat()
        coarse = stat.st_mtime_ns % SECOND_NS == 0
        return stat.st_size, stat.st_mtime_ns, file_sha256(path) if coarse else ""
    except FileNotFoundError:
        return None


def _marked_arch(marker: Path) -> object:
    """The arch a marker file records (``None`` for one that cannot be read)."""
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("arch")
    except (OSError, ValueError, AttributeError):
        return None
