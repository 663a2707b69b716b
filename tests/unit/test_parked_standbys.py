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
    for pid in waiting_in(parking.dir):  # what a test left parked, as a stop kills it
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
    """The pid of the shell parked for ``key``, once it waits on its FIFO."""
    for _ in range(200):
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if cwd == str(parking.dir) and command.endswith(f"\0{key}\0".encode()):
                return int(pid)
        time.sleep(0.02)
    raise AssertionError("no shell parked")


def test_a_parked_shell_runs_the_command_in_the_execs_directory_and_keeps_its_status(
    parking: HereParking,
) -> None:
    park_now(parking)
    parked_shell(parking)  # waiting where the keeper does not count it as work
    assert parking.waiting(KEY)
    standbys = Standbys(Context(), parking)
    command = ["sh", "-c", 'pwd; echo "to stderr" >&2; exit 3']
    text = shlex.join(command)
    standbys.offer("the line", Offer(KEY, "unused", text, parkable=True))
    stream = io.StringIO()
    handed = standbys.start("the line", stream)
    assert handed is not None and handed.running.pid is None  # nothing runs here
    assert handed.running.wait() == 3 and handed.began()
    assert stream.getvalue() == f"{parking.workdir}\nto stderr\n"  # the mark held back


def test_an_offer_that_is_not_parkable_never_claims_one(parking: HereParking) -> None:
    park_now(parking)
    parked_shell(parking)
    standbys = Standbys(Context(), parking)
    standbys.offer("the line", Offer(KEY, "unused", "true"))  # a compose container's
    assert standbys.start("the line", io.StringIO()) is None
    assert parking.waiting(KEY)


def test_a_parked_shell_that_died_is_no_standby_and_its_directory_goes(
    parking: HereParking,
) -> None:
    assert parking.claim(KEY, "true", io.StringIO()) is None  # never parked
    park_now(parking)
    os.killpg(os.getpgid(parked_shell(parking)), signal.SIGKILL)  # its container stopped
    time.sleep(0.1)
    assert parking.claim(KEY, "true", io.StringIO()) is None
    assert not (parking.dir / KEY).exists()


def test_a_run_parks_where_its_builds_used_a_parkable_offer_and_only_if_asked(
    parking: HereParking,
) -> None:
    standbys = Standbys(Context(), parking)
    standbys.offer("the line", Offer(KEY, "unused", "true", parkable=True))
    standbys.offer("other", Offer("fdl-warm-other", "unused", "true", parkable=True))
    assert standbys.start("the line", io.StringIO()) is None  # none parked yet: a plain exec
    standbys.close()  # a run that failed or was stopped parks nothing
    assert not parking.waiting(KEY)
    standbys.offer("the line", Offer(KEY, "unused", "true", parkable=True))
    assert standbys.start("the line", io.StringIO()) is None
    standbys.close(park=True)
    assert not parking.waiting(KEY)  # not before this process exits
    park_queued(now=True)
    parked_shell(parking)
    assert parking.waiting(KEY) and not parking.waiting("fdl-warm-other")  # not used
    ahead = Standbys(Context(), parking)
    ahead.ahead(KEY, "sh -c 'exit 9'")  # a standby of its own would be started: none is
    assert ahead._waiting == {}
    handed = parking.claim(KEY, "true", io.StringIO())
    assert handed is not None and handed.wait() == 0


def test_a_parked_shell_killed_while_it_runs_says_so(parking: HereParking) -> None:
    park_now(parking)
    parked_shell(parking)
    stream = io.StringIO()
    running = parking.claim(KEY, shlex.join(["sh", "-c", "echo started; exec sleep 30"]), stream)
    assert running is not None
    for _ in range(200):
        if "started" in stream.getvalue():
            break
        time.sleep(0.02)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):  # a stop: all of it killed
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if command.endswith(f"\0{KEY}\0".encode()) or command == b"sleep\x0030\x00":
            os.kill(int(pid), signal.SIGKILL)
    assert running.wait() == KILLED


def test_the_directory_is_per_project_in_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first, second = park_dir("/a/project"), park_dir("/another")
    assert first.parent == second.parent == tmp_path / "fdl-tasks" / "standbys"
    assert first != second


def test_a_parking_leaves_alone_the_directory_of_a_shell_running_a_command(
    parking: HereParking,
) -> None:
    """A claimed shell opens ``out`` after reading its command: another run's parking
    never remakes its directory before it has left its status. One killed before that
    (a stop) leaves none: the next claim removes the directory, and it parks again."""
    park_now(parking)
    shell = parked_shell(parking)
    running = parking.claim(KEY, shlex.join(["sh", "-c", "exec sleep 30"]), io.StringIO())
    assert running is not None and not parking.waiting(KEY)  # taken
    park_now(parking)
    assert not parking.waiting(KEY) and (parking.dir / KEY / "out").exists()
    os.killpg(os.getpgid(shell), signal.SIGKILL)
    assert running.wait() == KILLED
    park_now(parking)  # still no status: left alone
    assert not parking.waiting(KEY)
    assert parking.claim(KEY, "true", io.StringIO()) is None
    assert not (parking.dir / KEY).exists()
    park_now(parking)
    parked_shell(parking)
    assert parking.waiting(KEY)
