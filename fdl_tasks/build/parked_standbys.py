"""Standbys parked by one prebuild for the next, in the warm containers it built in.

A standby of :mod:`fdl_tasks.core.standbys` waits on the stdin of a ``docker exec``
client, which ends with the ``inv`` that started it: each prebuild paid three
``docker exec`` starts (~60 ms of CPU each: the client, the daemon, runc) beside its
preflight, on a machine whose two cores an edit's run keeps busy to its last build.
A parked one is started with ``docker exec -d`` as the process of a prebuild that
succeeded exits (the user is editing then), so nothing on this machine waits with it,
and the next prebuild's build only writes its command.

Each warm container of a ``docker run`` build sees this project's directory of them
at :data:`~fdl_tasks.build.warm_containers.PARK_MOUNT` (a mount of its own, in the
user's cache: FIFOs need a local file system), one directory per container holding
two FIFOs: the parked shell (:data:`~fdl_tasks.build.warm_containers.PARK`) reads its
command from ``go`` and writes its output to ``out``; its exit status is left in
``status``. Opening ``go`` without blocking says whether a shell still reads it
(``ENXIO``: its container stopped, it was killed): then the build runs as it would
have without one. A claim unlinks ``go``, so no other run takes the shell and no
parking remakes its directory before it has left its status; claims and parkings
take the directory's lock. A stop kills a parked shell with the rest of the
container's processes; the keeper does not count a waiting one as work, so the idle
timeout still holds.
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import errno
import hashlib
import os
import select
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

from fdl_tasks.build.warm_containers import PARK_MOUNT, park_argv
from fdl_tasks.core.locks import FileLock
from fdl_tasks.core.standbys import Output
from fdl_tasks.core.user_cache import cache_home

#: Seconds a claimed shell has to open ``out`` (it is already running: milliseconds); one
#: that does not never runs its command (it would wait on ``out`` for a reader).
OPEN_SECONDS = 2
#: The exit status of a command whose shell left none (killed, as ``docker exec`` says it).
KILLED = 128 + 9
#: Seconds a shell has, once parked, to be reading its FIFO (its ``docker exec -d`` starting).
READY_SECONDS = 2.0


class _Starting(Exception):
    """A shell parked moments ago is not reading its FIFO yet."""


def park_dir(root: str) -> Path:
    """The project's parked standbys, on this machine: one directory per container."""
    digest = hashlib.sha256(root.encode()).hexdigest()[:24]
    return Path(cache_home()) / "fdl-tasks" / "standbys" / digest


def park_mount(root: str) -> str:
    """The ``docker run`` option that shows the project's :func:`park_dir` to a warm
    container (made first: a missing source would be made by the daemon, as root)."""
    path = park_dir(root)
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return f"--volume={path}:{PARK_MOUNT}"


class ParkedRun:
    """A command handed to a parked shell: its output relayed from ``out`` until every
    writer closed it, then its status (:data:`KILLED` when the shell left none)."""

    pid = None  # nothing runs on this machine: a stop kills it in its container

    def __init__(self, slot: Path, out: int, relay: Output) -> None:
        self.slot, self.relay, self.code = slot, relay, KILLED
        self._thread = threading.Thread(target=self._relay, args=(out,), daemon=True)
        self._thread.start()

    def _relay(self, out: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            poller = select.poll()
            poller.register(out, select.POLLIN)
            if not poller.poll(OPEN_SECONDS * 1000):  # never opened: it never began
                return
            os.set_blocking(out, True)
            while chunk := os.read(out, 65536):
                self.relay.write(decoder.decode(chunk))
            self.relay.write(decoder.decode(b"", final=True))
        finally:
            os.close(out)
        with contextlib.suppress(OSError, ValueError):
            self.code = int((self.slot / "status").read_text(encoding="utf-8"))

    def wait(self) -> int:
        self._thread.join()
        return self.code


class Parking:
    """The project's parked standbys (:class:`~fdl_tasks.core.standbys.Parked`)."""

    def __init__(self, root: str) -> None:
        self.dir = park_dir(root)

    def waiting(self, key: str) -> bool:
        return (self.dir / key / "go").exists()

    def claim(self, key: str, text: str, relay: Output) -> ParkedRun | None:
        while True:
            try:
                with self._locked():
                    return self._try_claim(self.dir / key, text, relay)
            except _Starting:
                time.sleep(0.01)

    def _try_claim(self, slot: Path, text: str, relay: Output) -> ParkedRun | None:
        """The command handed to the slot's shell; ``None`` (the slot removed) when none
        reads its FIFO; :class:`_Starting` while one parked moments ago may still start."""
        try:
            go = os.open(slot / "go", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO and _parked_since(slot / "go") < READY_SECONDS:
                raise _Starting from None
            shutil.rmtree(slot, ignore_errors=True)
            return None
        try:
            out = os.open(slot / "out", os.O_RDONLY | os.O_NONBLOCK)
            (slot / "status").unlink(missing_ok=True)
            os.set_blocking(go, True)
            os.write(go, text.encode())
            (slot / "go").unlink()  # taken: no other run waits for it, none parks over it
        except OSError:
            return None
        finally:
            os.close(go)  # the shell's read ends: the command is whole
        return ParkedRun(slot, out, relay)

    def _locked(self) -> FileLock[str]:
        """The project's parked standbys held: a claim and a parking never interleave."""
        lock = FileLock.create(self.dir / ".lock")
        lock.take(wait=True)
        return lock

    def park(self, key: str) -> None:
        """A shell parked in container ``key`` as this process exits (:func:`park_queued`):
        a ``docker exec -d`` costs ~60 ms of CPU, paid while the user edits, not while
        this run's last work and exit still need the cores."""
        global _atexit_registered
        if not _atexit_registered:
            atexit.register(park_queued)
            _atexit_registered = True
        _queued.append((self, key))

    def parker(self, key: str) -> list[str]:
        """What parks the shell: a ``docker exec -d`` in container ``key``."""
        return park_argv(key)

    def _slot_made(self, key: str) -> bool:
        """Container ``key``'s directory made anew, with its two FIFOs; not one whose shell
        was handed a command and has not left its status (it may still open ``out``)."""
        slot = self.dir / key
        handed = (slot / "out").exists() and not (slot / "go").exists()
        if handed and not (slot / "status").exists():
            return False
        try:
            shutil.rmtree(slot, ignore_errors=True)
            slot.mkdir(mode=0o700, parents=True)
            for fifo in ("go", "out"):
                os.mkfifo(slot / fifo, 0o600)
        except OSError:
            shutil.rmtree(slot, ignore_errors=True)
            return False
        return True


#: What :meth:`Parking.park` was asked to park, started by :func:`park_queued`.
_queued: list[tuple[Parking, str]] = []
_atexit_registered = False


def park_queued(*, now: bool = False) -> None:
    """Every queued standby parked: each one's FIFOs made now, its ``docker exec -d``
    started once this process has ended (``now``: at once), by a shell in a session of
    its own that waits for a pipe only this process holds to close: their CPU is not
    this process's exit's. Nothing here waits for them; nothing of theirs holds this
    process's output."""
    queued, _queued[:] = list(_queued), []
    lines = []
    for parking, key in queued:
        with contextlib.suppress(OSError), parking._locked():
            if parking._slot_made(key):
                lines.append(shlex.join(parking.parker(key)) + " </dev/null >/dev/null 2>&1 &")
    if not lines:
        return
    after, held = os.pipe()
    script = f"({'' if now else 'cat >/dev/null; '}{chr(10).join(lines)}\n) &"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            ["sh", "-c", script],
            stdin=after,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            check=False,
            timeout=10,
        )
    os.close(after)
    if now:
        os.close(held)  # else left open: the kernel closes it as this process ends


def _parked_since(fifo: Path) -> float:
    """Seconds since ``fifo`` was made (its shell parked), ``inf`` when it is gone."""
    try:
        return time.time() - fifo.stat().st_mtime
    except OSError:
        return float("inf")
