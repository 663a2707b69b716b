"""Standbys parked for the next run: the real :data:`PARK` script in a real shell, the
real FIFOs, claimed through :class:`Standbys` as a build claims them.

No container here: the shell runs on this machine, with the script's mount path
(:data:`PARK_MOUNT`) replaced by the test's directory; everything else is the text
a warm container runs."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke.context import Context

from fdl_tasks.build.parked_standbys import KILLED, Parking, park_dir, park_queued
from fdl_tasks.build.warm_containers import PARK, PARK_MOUNT
from fdl_tasks.core.standbys import Offer, Standbys

KEY = "fdl-warm-0123456789abcdef0123"


class HereParking(Parking):
    """Parks the real script in a shell on this machine, in ``workdir`` (the exec's)."""

    def __init__(self, root: str, workdir: Path) -> None:
        super().__init__(root)
        self.workdir = workdir

    def parker(self, key: str) -> list[str]:
        script = PARK.replace(PARK_MOUNT, str(self.dir))
        return [
            "sh",
            "-c",
            f'cd {shlex.quote(str(self.workdir))} && exec sh -c "$0" sh "$1"',
            script,
            key,
        ]


@pytest.fixture
def parking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HereParking]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "work dir").mkdir()
    parking = HereParking(str(tmp_path / "project"), tmp_path / "work dir")
    yield parking
    for pid in waiting_in(parking.dir) + waiting_in(parking.workdir):  # as a stop kills them
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)


def waiting_in(folder: Path) -> list[int]:
    """The processes whose working directory is ``folder``."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                found.append(pid)
    return found


def park_now(parking: Parking, key: str = KEY) -> None:
    """Parked as a run's process parks it when it exits."""
    parking.park(key)
    park_queued(now=True)


def parked_shell(parking: Parking, key: str = KEY) -> int:
    """The pid of the shell parked for ``key``, once it is ready: waiting for a claim."""
    for _ in range(250):
        if parking.waiting(key):
            for pid in waiting_in(parking.dir):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes().endswith(f"\0{key}\0".encode()):
                        return pid
        time.sleep(0.02)
    raise AssertionError("no shell parked")


def test_a_parked_shell_runs_the_command_in_the_execs_directory_and_keeps_its_status(
    parking: HereParking,
) -> None:
    park_now(parking)
    parked_shell(parking)  # waiting where the keeper does not count it as work
    standbys = Standbys(Context(), parking)
    command = ["sh", "-c", 'pwd; echo "to stderr" >&2; exit 3']
    standbys.offer("the line", Offer(KEY, "unused", shlex.join(command), parkable=True))
    stream = io.StringIO()
    handed = standbys.start("the line", stream)
    assert handed is not None and handed.running.pid is None  # nothing runs here
    assert not parking.waiting(KEY)  # taken
    assert handed.running.wait() == 3 and handed.began()
    assert stream.getvalue() == f"{parking.workdir}\nto stderr\n"  # what it said before, not


def test_an_offer_that_is_not_parkable_never_claims_one(parking: HereParking) -> None:
    park_now(parking)
    parked_shell(parking)
    standbys = Standbys(Context(), parking)
    standbys.offer("the line", Offer(KEY, "unused", "true"))  # a compose container's
    assert standbys.start("the line", io.StringIO()) is None
    assert parking.waiting(KEY)


def test_a_parked_shell_that_is_gone_is_no_standby_and_its_slot_goes(parking: HereParking) -> None:
    assert parking.claim(KEY, "true", io.StringIO()) is None  # never parked
    park_now(parking)
    os.killpg(os.getpgid(parked_shell(parking)), signal.SIGKILL)  # its container stopped
    assert parking.waiting(KEY)  # as far as its slot says
    ran = parking.workdir / "ran"
    assert parking.claim(KEY, shlex.join(["touch", str(ran)]), io.StringIO()) is None
    assert not (parking.dir / KEY).exists() and not ran.exists()


def test_a_shell_that_cannot_wait_in_its_slot_is_not_waiting(parking: HereParking) -> None:
    """Its slot not its own (rootless Docker, another user): it says nothing, so a run
    starts a standby of its own beside preflight, and its build does not wait for it."""
    parking.parker = lambda key: ["true"]  # type: ignore[method-assign]
    park_now(parking)
    time.sleep(0.2)
    assert not parking.waiting(KEY)
    ahead = Standbys(Context(), parking)
    ahead.ahead(KEY, "cat >/dev/null")
    assert list(ahead._waiting) == [KEY]
    ahead.close()


def test_a_command_cut_short_is_never_run(parking: HereParking) -> None:
    """A claimer that dies while writing: the shell read a command without its end."""
    park_now(parking)
    parked_shell(parking)
    slot = parking.dir / KEY
    out = os.open(slot / "out", os.O_RDONLY | os.O_NONBLOCK)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # it says it is there
        with contextlib.suppress(BlockingIOError):
            if os.read(out, 100):
                break
        time.sleep(0.01)
    ran = parking.workdir / "ran"
    for _ in range(100):
        with contextlib.suppress(OSError):
            go = os.open(slot / "go", os.O_WRONLY | os.O_NONBLOCK)
            break
        time.sleep(0.01)
    os.write(go, f"touch {shlex.quote(str(ran))}\n".encode())
    os.close(go)
    os.set_blocking(out, True)
    assert os.read(out, 100) == b""  # it ended, having run nothing
    os.close(out)
    assert not ran.exists() and not (slot / "status").exists()


def test_a_run_parks_where_its_builds_used_a_parkable_offer_and_only_if_asked(
    parking: HereParking,
) -> None:
    standbys = Standbys(Context(), parking)
    standbys.offer("the line", Offer(KEY, "unused", "true", parkable=True))
    standbys.offer("other", Offer("fdl-warm-other", "unused", "true", parkable=True))
    assert standbys.start("the line", io.StringIO()) is None  # none parked yet: a plain exec
    standbys.close()  # a run that failed or was stopped parks nothing
    park_queued(now=True)
    assert not (parking.dir / KEY).exists()
    standbys.offer("the line", Offer(KEY, "unused", "true", parkable=True))
    assert standbys.start("the line", io.StringIO()) is None
    standbys.close(park=True)
    assert not (parking.dir / KEY).exists()  # not before this process exits
    park_queued(now=True)
    parked_shell(parking)
    assert not parking.waiting("fdl-warm-other")  # not used
    ahead = Standbys(Context(), parking)
    ahead.ahead(KEY, "cat >/dev/null")  # a standby of its own would be started: none is
    assert ahead._waiting == {}
    running = parking.claim(KEY, "true", io.StringIO())
    assert running is not None and running.wait() == 0


def test_a_parked_shell_killed_while_it_runs_says_so_and_leaves_no_slot(
    parking: HereParking,
) -> None:
    park_now(parking)
    shell = parked_shell(parking)
    stream = io.StringIO()
    command = shlex.join(["sh", "-c", "echo started; exec sleep 30"])
    running = parking.claim(KEY, command, stream)
    assert running is not None
    park_now(parking)  # another run's parking: its slot is left alone while it runs
    assert (parking.dir / KEY / "out").exists() and not parking.waiting(KEY)
    for _ in range(250):
        if "started" in stream.getvalue():
            break
        time.sleep(0.02)
    os.killpg(os.getpgid(shell), signal.SIGKILL)  # a stop: all of it killed
    assert running.wait() == KILLED
    assert not (parking.dir / KEY).exists()  # so the next parking makes it anew
    park_now(parking)
    parked_shell(parking)


def test_a_parking_releases_a_shell_still_waiting_in_the_slot(parking: HereParking) -> None:
    park_now(parking)
    first = parked_shell(parking)
    park_now(parking)  # a key parked twice (two runs ending together)
    for _ in range(250):
        if not Path(f"/proc/{first}").exists():
            break
        time.sleep(0.02)
    assert not Path(f"/proc/{first}").exists()  # ended, not left waiting on a lost FIFO
    assert parked_shell(parking) != first  # the new one waits


def test_the_directory_is_per_project_in_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first, second = park_dir("/a/project"), park_dir("/another")
    assert first.parent == second.parent == tmp_path / "fdl-tasks" / "standbys"
    assert first != second


def test_a_slot_left_by_a_run_that_died_is_parked_in_again(parking: HereParking) -> None:
    """A run killed (SIGKILL) as its build ran in a parked shell leaves its slot taken
    and without a status, and no lock held: the next parking makes it anew."""
    slot = parking.dir / KEY
    slot.mkdir(parents=True)
    os.mkfifo(slot / "out")
    os.mkfifo(slot / "go")
    park_now(parking)
    parked_shell(parking)
    assert parking.waiting(KEY)
