"""Standbys parked by one prebuild for the next, in the warm containers it built in.

A standby of :mod:`fdl_tasks.core.standbys` waits on the stdin of a ``docker exec``
client, which ends with the ``inv`` that started it: each prebuild paid three
``docker exec`` starts (~60 ms of CPU each: the client, the daemon, runc) beside its
preflight, on a machine whose two cores an edit's run keeps busy to its last build.
A parked one is started with ``docker exec -d`` as a prebuild ends, so nothing on
this machine waits with it, and the next prebuild's build only writes its command.

Each warm container of a ``docker run`` build sees this project's directory of them
at :data:`~fdl_tasks.build.warm_containers.PARK_MOUNT` (a mount of its own, in the
user's cache: FIFOs need a local file system), one directory per container holding
two FIFOs: the parked shell (:data:`~fdl_tasks.build.warm_containers.PARK`) reads its
command from ``go`` and writes its output to ``out``; its exit status is left in
``status``. Opening ``go`` without blocking says whether a shell still reads it
(``ENXIO``: its container stopped, it was killed): then the build runs as it would
have without one. Claims and parks happen under the project lock, so two runs never
share one. A stop kills a parked shell with the rest of the container's processes;
the keeper does not count a waiting one as work, so the idle timeout still holds.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import os
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

from fdl_tasks.build.warm_containers import PARK_MOUNT, park_argv
from fdl_tasks.core.standbys import Output
from fdl_tasks.core.user_cache import cache_home

#: Seconds a claimed shell has to open ``out``: one that does not was not there.
OPEN_SECONDS = 10
#: The exit status of a command whose shell left none (killed, as ``docker exec`` says it).
KILLED = 128 + 9
#: Seconds a shell has, once parked, to be reading its FIFO (its ``docker exec -d`` starting).
READY_SECONDS = 2.0


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
        slot = self.dir / key
        go = _reader_waiting(slot / "go")
        if go is None:
            shutil.rmtree(slot, ignore_errors=True)
            return None
        try:
            out = os.open(slot / "out", os.O_RDONLY | os.O_NONBLOCK)
            (slot / "status").unlink(missing_ok=True)
            os.set_blocking(go, True)
            os.write(go, text.encode())
        except OSError:
            return None
        finally:
            os.close(go)  # the shell's read ends: the command is whole
        return ParkedRun(slot, out, relay)

    def park(self, key: str) -> None:
        """A shell parked in container ``key`` (its FIFOs made anew), by a ``docker exec
        -d`` left to start on its own: the run that parks it does not wait for it."""
        slot = self.dir / key
        try:
            shutil.rmtree(slot, ignore_errors=True)
            slot.mkdir(mode=0o700, parents=True)
            for fifo in ("go", "out"):
                os.mkfifo(slot / fifo, 0o600)
            subprocess.run(
                ["sh", "-c", '"$@" >/dev/null 2>&1 &', "sh", *self.parker(key)],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                check=False,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            shutil.rmtree(slot, ignore_errors=True)

    def parker(self, key: str) -> list[str]:
        """What parks the shell: a ``docker exec -d`` in container ``key``."""
        return park_argv(key)


def _reader_waiting(fifo: Path) -> int | None:
    """``fifo`` opened to write, if a shell reads it (``ENXIO`` when none does): one parked
    moments ago may still be starting, so it gets :data:`READY_SECONDS` from its parking."""
    try:
        ready_by = fifo.stat().st_mtime + READY_SECONDS
    except OSError:
        return None
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.time() >= ready_by:
                return None
        time.sleep(0.01)
