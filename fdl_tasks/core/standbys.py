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

A prebuild also leaves, as it ends, a standby *parked* for the next one in each
container it built in (:class:`Parked`, :mod:`fdl_tasks.build.parked_standbys`):
nothing on this machine waits with it, so the next ``inv`` pays no ``docker exec``
start at all for its builds; a line offered as ``parkable`` runs in one when it waits.
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
    ``standby`` starts one, ``text`` is what the line runs, written to its stdin;
    ``parkable``: a standby may be parked there (:class:`Parked`)."""

    key: str
    standby: str
    text: str
    parkable: bool = False


class Running(Protocol):
    """A build's command under way: its process on this machine (``None``: none) and,
    once it has ended, its exit status."""

    @property
    def pid(self) -> int | None: ...

    def wait(self) -> int: ...


@attrs.frozen
class Spawned:
    """A command Invoke started (:func:`run_in_background`) as a :class:`Running`."""

    promise: Any  # invoke's Promise

    @property
    def pid(self) -> int | None:
        return int(self.promise.runner.process.pid)

    def wait(self) -> int:
        return int(self.promise.join().exited)


class Parked(Protocol):
    """Standbys left by one run for the next, each keyed like :class:`Offer` s."""

    def waiting(self, key: str) -> bool:
        """Whether one was parked for ``key`` (it may have died since)."""

    def claim(self, key: str, text: str, relay: Output) -> Running | None:
        """``text`` run by the one parked for ``key``, its output to ``relay``; ``None``
        when none waits there any more."""

    def park(self, key: str) -> None:
        """One parked for ``key``, started without waiting for it."""


@attrs.define
class _Waiting:
    promise: Any  # invoke's Promise
    relay: Relay


@attrs.frozen
class Handed:
    """A command handed to the standby of ``key``, ``running``."""

    key: str
    running: Running
    relay: Relay

    def began(self) -> bool:
        """Whether the standby ran the command (an ended one that did not never will)."""
        return self.relay.began


class Standbys:
    """One session's standbys, at most one waiting per key. Thread-safe: builds take
    theirs side by side."""

    def __init__(self, c: Context, parked: Parked | None = None) -> None:
        self.c, self.parked = c, parked
        self._offers: dict[str, Offer] = {}
        #: Keys a build used, with their offer: :meth:`refill` starts these.
        self._wanted: dict[str, Offer] = {}
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
            self._wanted[offer.key] = offer
            waiting = self._waiting.pop(offer.key, None)
        if waiting is None:
            return self._claim(offer, stream)
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
        return Handed(offer.key, Spawned(waiting.promise), waiting.relay)

    def _claim(self, offer: Offer, stream: Output) -> Handed | None:
        """The offer run by the standby parked for its key, if one waits."""
        if self.parked is None or not offer.parkable:
            return None
        relay = Relay()
        relay.target = stream
        running = self.parked.claim(offer.key, offer.text, relay)
        return None if running is None else Handed(offer.key, running, relay)

    def ahead(self, key: str, standby: str) -> None:
        """A standby for ``key`` started now, unless one waits, or is parked: a run's build
        that its look says will run, while preflight waits on the hosts."""
        if self.parked is not None and self.parked.waiting(key):
            return
        with self._lock:
            if key not in self._waiting:
                self._waiting[key] = self._started(standby)

    def refill(self) -> None:
        """A standby for every key a build used, where none waits. A key whose standby
        ended unused (its container stopped or was replaced) is forgotten."""
        with self._lock:
            for key, offer in list(self._wanted.items()):
                waiting = self._waiting.get(key)
                if waiting is not None and waiting.promise.runner.process_is_finished:
                    del self._waiting[key], self._wanted[key]
                    _end(waiting)
                elif waiting is None:
                    self._waiting[key] = self._started(offer.standby)

    def _started(self, standby: str) -> _Waiting:
        relay = Relay()
        return _Waiting(run_in_background(self.c, standby, relay), relay)

    def close(self, *, park: bool = False) -> None:
        """Every waiting standby told there is nothing to run: each exits at once. With
        ``park``, one parked for the next run where a build used a parkable offer."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
            wanted, self._wanted = list(self._wanted.values()), {}
        if park and self.parked is not None:
            for offer in wanted:
                if offer.parkable:
                    self.parked.park(offer.key)
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
