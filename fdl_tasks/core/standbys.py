"""Commands started ahead of their need, each waiting on its stdin for what it will run.

Starting a ``docker exec`` costs ~70 ms and as much CPU (the client, the daemon,
runc) before its command runs; three builds at once on two cores pay it beside
their compilers. A process that has already started and only waits for its
command costs nothing then. A ``--watch`` session starts them after each cycle,
while the user is editing, so the next cycle's builds only write their command; a
prebuild starts them while preflight waits on its hosts, for the builds it will run.

Nothing here knows what the commands are: the warm build containers offer each
build's line with the standby that can run it
(:meth:`~fdl_tasks.build.warm_containers_io.WarmContainers.exec_line`).
A standby closed without a command exits 0 having run nothing, so nothing is
left behind: when the process holding it ends, its stdin closes too.

A standby says :data:`BEGAN` on stderr as its command begins (held back from the
build's output): one killed in the moment between being handed its command and
running it (its container stopped, its processes killed by another run's stop)
ends without having said it, and the build runs as it would have without one.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import Any, Protocol

import attrs
from invoke.context import Context

#: Seconds a closed standby has to end before it is killed.
CLOSE_SECONDS = 10
#: What a standby writes to stderr as its command begins, and nothing else does.
BEGAN = "fdl-tasks standby: the command begins\n"


class Output(Protocol):
    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


class Relay:
    """A standby's output (stdout and stderr, each written from a thread of its own):
    held until the standby says :data:`BEGAN`, then passed to :attr:`target`, the
    build's stream, set when the command is handed over. What it said before (a docker
    client's error as it dies) goes nowhere; so does the mark."""

    def __init__(self) -> None:
        self.target: Output | None = None
        self.began = False
        self._held = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            if not self.began:
                self._held += text
                at = self._held.find(BEGAN)
                if at < 0:
                    return
                self.began = True
                text = self._held[:at] + self._held[at + len(BEGAN) :]
                self._held = ""
            if self.target is not None and text:
                self.target.write(text)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()


def run_in_background(c: Context, line: str, output: Output) -> Any:
    """``line`` started in the background (invoke's promise), stdout and stderr both to
    ``output``. Its stdin is a pipe of its own: the terminal's keys stay with the user
    (Ctrl-C stops the run) and a standby gets only what is written to it."""
    return c.run(
        line,
        asynchronous=True,
        warn=True,
        hide=False,
        pty=False,
        in_stream=False,
        out_stream=output,
        err_stream=output,
    )


@attrs.frozen
class Offer:
    """A line that may run in a standby: ``key`` names the standby (its container),
    ``standby`` starts one, ``text`` is what the line runs, written to its stdin."""

    key: str
    standby: str
    text: str


@attrs.define
class _Waiting:
    promise: Any  # invoke's Promise
    relay: Relay


@attrs.frozen
class Handed:
    """A command handed to the standby of ``key``: its running ``promise``."""

    key: str
    promise: Any  # invoke's Promise
    relay: Relay

    def began(self) -> bool:
        """Whether the standby ran the command (an ended one that did not never will)."""
        return self.relay.began


class Standbys:
    """One session's standbys, at most one waiting per key. Thread-safe: builds take
    theirs side by side."""

    def __init__(self, c: Context) -> None:
        self.c = c
        self._offers: dict[str, Offer] = {}
        #: Keys a build used, with their standby's line: :meth:`refill` starts these.
        self._wanted: dict[str, str] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._lock = threading.Lock()

    def offer(self, line: str, offer: Offer) -> None:
        """``line`` may run as ``offer.text`` written to a standby of ``offer.key``."""
        with self._lock:
            self._offers[line] = offer

    def start(self, line: str, stream: Output) -> Handed | None:
        """``line``'s command, handed to the standby waiting for it, its output to
        ``stream``; ``None`` when none waits (run ``line``)."""
        with self._lock:
            offer = self._offers.get(line)
            if offer is None:
                return None
            self._wanted[offer.key] = offer.standby
            waiting = self._waiting.pop(offer.key, None)
        if waiting is None:
            return None
        runner = waiting.promise.runner
        waiting.relay.target = stream
        try:
            if runner.process_is_finished:
                raise BrokenPipeError
            runner.write_proc_stdin(offer.text)
            runner.close_proc_stdin()
        except OSError:  # it ended before its command (its container went): run ``line``
            waiting.relay.target = None
            _end(waiting)
            return None
        return Handed(offer.key, waiting.promise, waiting.relay)

    def ahead(self, key: str, standby: str) -> None:
        """A standby for ``key`` started now, unless one waits: a run's build that its look
        says will run, while preflight waits on the hosts."""
        with self._lock:
            if key not in self._waiting:
                self._waiting[key] = self._started(standby)

    def refill(self) -> None:
        """A standby for every key a build used, where none waits. A key whose standby
        ended unused (its container stopped or was replaced) is forgotten."""
        with self._lock:
            for key, standby in list(self._wanted.items()):
                waiting = self._waiting.get(key)
                if waiting is not None and waiting.promise.runner.process_is_finished:
                    del self._waiting[key], self._wanted[key]
                    _end(waiting)
                elif waiting is None:
                    self._waiting[key] = self._started(standby)

    def _started(self, standby: str) -> _Waiting:
        relay = Relay()
        return _Waiting(run_in_background(self.c, standby, relay), relay)

    def close(self) -> None:
        """Every waiting standby told there is nothing to run: each exits at once."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
            self._wanted.clear()
        for one in waiting:
            with contextlib.suppress(OSError):
                one.promise.runner.close_proc_stdin()
        for one in waiting:  # a docker client that hangs is not waited for
            process = one.promise.runner.process
            try:
                process.wait(CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
            one.promise.join()


def _end(waiting: _Waiting) -> None:
    """Join a standby that has ended: its stdin closed first, so that nothing it left
    (a ``cat`` whose shell was killed) holds its output open."""
    with contextlib.suppress(OSError):
        waiting.promise.runner.close_proc_stdin()
    waiting.promise.join()
