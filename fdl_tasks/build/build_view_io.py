"""One run's builds on the status board: cargo's stream to the log, its bar live, each
diagnostic once.

Each build's ``c.run`` writes into a :class:`BuildOutput`; what it says is cut
by :class:`~fdl_tasks.build.cargo_output.CargoOutput`. Everything but the bar
goes to the build's log; the bar feeds the build's live line; a diagnostic
waits in the :class:`~fdl_tasks.build.diagnostics.Grouper` until it can be
said once for every build that gave it (other lines too: a build script's, the
container tool's, ours). cargo's status lines (``Compiling``) show only in plain
output; on a terminal the bar stands for them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TextIO

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_view import job_labels, own_strings, result_line, titled
from fdl_tasks.build.cargo_output import CargoOutput, Diagnostic, Event, Other, Progress
from fdl_tasks.build.diagnostics import Grouper
from fdl_tasks.core.console import StatusBoard
from fdl_tasks.core.reporting import Report


class BuildView:
    """The builds of one run as the person watching sees them (thread-safe).

    A build's started and result lines go to the run's ``report`` (a quiet watch
    cycle keeps them back: its one line says it all); its diagnostics, its live line
    and, in plain output, cargo's lines and the periodic progress go to the board.
    """

    def __init__(
        self, board: StatusBoard, jobs: Sequence[BuildJob], report: Report, task: str
    ) -> None:
        self.board, self.report, self.task = board, report, task
        self.labels = job_labels(jobs)
        self._grouper = Grouper([self.labels[job.name] for job in jobs])
        self._lock = threading.Lock()

    def title(self, job: BuildJob) -> str:
        return titled(self.labels[job.name], job.hosts)

    def started(self, job: BuildJob, expected: float | None) -> None:
        """``expected``: seconds cargo ran the last time, for the estimate."""
        title = self.title(job)
        self.board.started(job.name, title, name=self.labels[job.name], expected=expected)
        if not self.board.live:
            self.report(f"{self.task}: {title} started")

    def finished(
        self, job: BuildJob, *, ok: bool, seconds: float, detail: str = "", stopped: bool = False
    ) -> None:
        """The build's live line gives way to its result line, said after what its
        diagnostics were waiting for."""
        with self._lock:
            self._say(self._grouper.finish(self.labels[job.name]))
        self.board.finished(job.name)
        line = result_line(
            self.task, self.title(job), ok=ok, seconds=seconds, detail=detail, stopped=stopped
        )
        self.report(line)

    def close(self) -> None:
        """Every diagnostic still held (a stopped run's), said now."""
        with self._lock:
            for label in self.labels.values():
                self._say(self._grouper.finish(label))

    def output(self, job: BuildJob, log: TextIO | None) -> BuildOutput:
        return BuildOutput(self, job, log)

    def diagnostic(self, job: BuildJob, lines: Sequence[str]) -> None:
        with self._lock:
            self._say(self._grouper.add(self.labels[job.name], lines, own_strings(job)))

    def _say(self, diagnostics: list[list[str]]) -> None:
        for lines in diagnostics:
            self.board.say("\n".join(lines))


class BuildOutput:
    """A stream for one build's ``c.run``: its log, its live line, its diagnostics."""

    def __init__(self, view: BuildView, job: BuildJob, log: TextIO | None) -> None:
        self.view, self.job, self.log = view, job, log
        self.label = view.labels[job.name]
        self._cargo = CargoOutput()

    def write(self, text: str) -> int:
        self._handle(self._cargo.feed(text))
        return len(text)

    def flush(self) -> None:
        if self.log:
            self.log.flush()

    def close(self) -> None:
        """The end of the stream: a last partial line, a last diagnostic."""
        self._handle(self._cargo.close())
        self.flush()

    def _handle(self, events: list[Event]) -> None:
        board = self.view.board
        for event in events:
            if isinstance(event, Progress):
                board.progress(self.job.name, event.done, event.total, event.crates)
                continue
            lines = event.lines if isinstance(event, Diagnostic) else (event.line,)
            if self.log:
                self.log.write("".join(f"{line}\n" for line in lines))
            if isinstance(event, Diagnostic | Other):  # said once for every build alike
                self.view.diagnostic(self.job, lines)
            elif not board.live:  # cargo's status lines: the bar stands for them live
                board.say(f"[{self.label}] {event.line}")
