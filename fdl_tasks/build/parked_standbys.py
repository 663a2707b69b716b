"""Standbys parked by one prebuild for the next, in the warm containers it built in.

A standby of :mod:`fdl_tasks.core.standbys` ends with the ``inv`` whose ``docker exec``
client it waits on, so each prebuild paid three exec starts (~60 ms of CPU each) on
cores its builds keep busy. A parked one is started with ``docker exec -d`` once a
prebuild that succeeded has exited (the user is editing then): the next one's builds
only write their commands.

Each warm container of a ``docker run`` build sees this project's directory of them
at :data:`~fdl_tasks.build.warm_containers.PARK_MOUNT` (a mount of its own, in the
user's cache: FIFOs need a local file system), one directory (a *slot*) per
container. The parked shell (:data:`~fdl_tasks.build.warm_containers.PARK`) says it
is ``ready``, then waits for a claimer to open the FIFO ``out``, says ``parked`` there
(so a claim never writes a command to a shell that is gone: its container stopped or
was replaced), reads its command from the FIFO ``go``, runs it only if it came whole,
and leaves its exit status in ``status``. A claim takes the slot (``ready`` removed);
one that ends without a status (a stop killed it) removes the slot, so that the next
parking makes it anew. A claim holds the slot's lock until its build has ended, and a
parking never waits for it (that run parks its own as it ends); a parking releases a
shell still waiting in a slot before remaking it. Nothing here
follows a link a container could have put in a slot. The keeper does not count a
waiting shell as work, so the idle timeout still holds.
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
import stat
import subprocess
import threading
import time
from pathlib import Path

from fdl_tasks.build.warm_containers import PARK_END, PARK_MOUNT, PARKED, park_argv
from fdl_tasks.core.locks import FileLock
from fdl_tasks.core.standbys import Output
from fdl_tasks.core.user_cache import cache_home

#: Seconds a parked shell has to answer a claim (milliseconds: it waits for one); one
#: that does not is gone, and its slot with it.
ANSWER_SECONDS = 0.5
#: The exit status of a command whose shell left none (killed, as ``docker exec`` says it).
KILLED = 128 + 9


def park_dir(root: str) -> Path:
    """The project's parked standbys, on this machine: one directory per container."""
    digest = hashlib.sha256(root.encode()).hexdigest()[:24]
    return Path(cache_home()) / "fdl-tasks" / "standbys" / digest


def park_mount(root: str) -> str | None:
    """The ``docker run`` option that shows the project's :func:`park_dir` to a warm
    container (made first: a missing source would be made by the daemon, as root);
    ``None`` when it cannot be made here, or written: then nothing is parked."""
    path = park_dir(root)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return f"--volume={path}:{PARK_MOUNT}" if os.access(path, os.W_OK | os.X_OK) else None


def _open_fifo(path: Path, flags: int) -> int:
    """A FIFO of a slot opened without blocking, never through a link (a container can
    write in its slot: ``OSError`` for anything but a FIFO)."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a FIFO", str(path))
    return fd


class ParkedRun:
    """A command handed to a parked shell: its output relayed from ``out`` until every
    writer closed it, then its status (:data:`KILLED`, and the slot removed, when the
    shell left none). It holds the slot's ``lock`` until then: no parking remakes the
    slot of a build that runs."""

    pid = None  # nothing runs on this machine: a stop kills it in its container

    def __init__(self, slot: Path, lock: FileLock[str], out: int, relay: Output) -> None:
        self.slot, self.lock, self.relay, self.code = slot, lock, relay, KILLED
        self._thread = threading.Thread(target=self._relay, args=(out,), daemon=True)
        self._thread.start()

    def _relay(self, out: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            os.set_blocking(out, True)
            while chunk := os.read(out, 65536):
                self.relay.write(decoder.decode(chunk))
            self.relay.write(decoder.decode(b"", final=True))
            status = os.open(self.slot / "status", os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(status) as file:
                self.code = int(file.read(16))
        except (OSError, ValueError):
            shutil.rmtree(self.slot, ignore_errors=True)
        finally:
            os.close(out)
            self.lock.close()

    def wait(self) -> int:
        self._thread.join()
        return self.code


class Parking:
    """The project's parked standbys (:class:`~fdl_tasks.core.standbys.Parked`)."""

    def __init__(self, root: str) -> None:
        self.dir = park_dir(root)

    def waiting(self, key: str) -> bool:
        return (self.dir / key / "ready").exists()

    def claim(self, key: str, text: str, relay: Output) -> ParkedRun | None:
        """A slot whose shell is not ready (one that never started, or a run's that is
        over) is removed."""
        slot = self.dir / key
        try:
            lock = self._lock(key, wait=True)
        except OSError:
            return None
        try:
            out = -1
            if (slot / "ready").exists():
                out = _open_fifo(slot / "out", os.O_RDONLY)
                if _handed(slot, out, text):
                    return ParkedRun(slot, lock, out, relay)
        except OSError:  # its shell died as it was handed the command: none ran
            pass
        if out >= 0:
            os.close(out)
        shutil.rmtree(slot, ignore_errors=True)
        lock.close()
        return None

    def _lock(self, key: str, *, wait: bool) -> FileLock[str]:
        """Container ``key``'s slot held (its lock beside it, never opened through a link
        a container put there): a claim for its build's whole run, a parking while it
        makes the slot; ``OSError`` when not ``wait`` and another holds it."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.dir / f"{key}.lock"
        stream = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+")
        lock = FileLock(path, stream)
        try:
            if lock.take(wait=wait):
                return lock
        except OSError:
            pass
        lock.close()
        raise OSError(errno.EAGAIN, "held", str(path))

    def park(self, key: str) -> None:
        """A shell parked in container ``key`` once this process has exited
        (:func:`park_queued`): its CPU is paid while the user edits."""
        global _atexit_registered
        if not _atexit_registered:
            atexit.register(park_queued)
            _atexit_registered = True
        _queued[(self.dir, key)] = self

    def parker(self, key: str) -> list[str]:
        """What parks the shell: a ``docker exec -d`` in container ``key``."""
        return park_argv(key)

    def _slot_made(self, key: str) -> bool:
        """Container ``key``'s slot made anew, with its two FIFOs (a shell still waiting
        in it released first), unless a build runs in it (another run's claim holds it:
        that run parks its own as it ends)."""
        try:
            lock = self._lock(key, wait=False)
        except OSError:
            return False
        slot = self.dir / key
        with lock:
            _released(slot)
            try:
                shutil.rmtree(slot, ignore_errors=True)
                slot.mkdir(mode=0o700, parents=True)
                for fifo in ("go", "out"):
                    os.mkfifo(slot / fifo, 0o600)
            except OSError:
                shutil.rmtree(slot, ignore_errors=True)
                return False
        return True


def _handed(slot: Path, out: int, text: str) -> bool:
    """``text`` handed to the slot's shell, once it has said it is there (it does as
    ``out`` is opened); ``False`` when it never does. The command is written whole,
    with :data:`PARK_END` (the shell runs nothing else), and the slot taken."""
    deadline = time.monotonic() + ANSWER_SECONDS
    if not _answered(out, deadline):
        return False
    go = _go(slot, deadline)
    try:
        os.set_blocking(go, True)
        data = f"{text}\n{PARK_END}".encode()
        while data:
            data = data[os.write(go, data) :]
    finally:
        os.close(go)  # a command cut short ends without its end: the shell runs nothing
    (slot / "ready").unlink(missing_ok=True)
    return True


def _released(slot: Path) -> None:
    """A shell still waiting in the slot told there is nothing to run: it ends."""
    if not (slot / "ready").exists():
        return
    try:
        out = _open_fifo(slot / "out", os.O_RDONLY)
    except OSError:
        return
    try:
        deadline = time.monotonic() + ANSWER_SECONDS
        if _answered(out, deadline):
            os.close(_go(slot, deadline))  # nothing written: it reads nothing, and ends
    except OSError:
        pass
    finally:
        os.close(out)


def _answered(out: int, deadline: float) -> bool:
    """Whether the slot's shell said :data:`PARKED` on ``out`` by ``deadline``."""
    said = b""
    poller = select.poll()
    poller.register(out, select.POLLIN)
    while not said.startswith(PARKED.encode()):
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return False
        try:
            chunk = os.read(out, len(PARKED) - len(said))
        except BlockingIOError:
            continue
        if not chunk:
            return False  # it ended: nothing more will come
        said += chunk
    return True


def _go(slot: Path, deadline: float) -> int:
    """The slot's ``go`` opened to write, once its shell reads it (it does as soon as it
    has said it is there); ``OSError`` past ``deadline``."""
    while True:
        try:
            return _open_fifo(slot / "go", os.O_WRONLY)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
        time.sleep(0.002)


#: What :meth:`Parking.park` was asked to park, started by :func:`park_queued`.
_queued: dict[tuple[Path, str], Parking] = {}
_atexit_registered = False


def park_queued(*, now: bool = False) -> None:
    """Every queued standby parked: each one's slot made now, its ``docker exec -d``
    started once this process has ended (``now``: at once), by a shell in a session of
    its own that waits for a pipe only this process holds to close: their CPU is not
    this process's exit's. Nothing here waits for them; nothing of theirs holds this
    process's output."""
    queued = list(_queued.items())
    _queued.clear()
    lines = []
    for (_, key), parking in queued:
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
