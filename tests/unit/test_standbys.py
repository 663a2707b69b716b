"""Standbys for real: processes started ahead, each waiting on its stdin for its command.

The standby here is :data:`~fdl_tasks.build.warm_containers.STANDBY` run by this
machine's ``sh`` (a warm container runs it through ``docker exec -i``, which the
rig's ``test_warm.py`` covers), so the script, the quoting and the
:class:`~fdl_tasks.core.standbys.Standbys` bookkeeping are the real ones.
"""

from __future__ import annotations

import io
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from invoke.context import Context

from fdl_tasks.build.warm_containers import STANDBY
from fdl_tasks.core.standbys import Offer, Standbys

STANDBY_LINE = shlex.join(["sh", "-c", STANDBY])


def offered(standbys: Standbys, argv: list[str], key: str = "k") -> str:
    """A line the standbys of ``key`` may run (the line itself runs ``argv`` too)."""
    line = shlex.join(argv)
    standbys.offer(line, Offer(key, STANDBY_LINE, line))
    return line


def waiting(standbys: Standbys, key: str = "k") -> int:
    """The pid of the standby waiting for ``key`` (the shell running the script)."""
    pid = standbys._waiting[key].promise.runner.process.pid
    return int(pid)


def test_a_line_with_no_standby_waiting_is_left_to_run_itself() -> None:
    standbys = Standbys(Context())
    assert standbys.start("echo never", io.StringIO()) is None  # never offered
    line = offered(standbys, ["echo", "x"])
    assert standbys.start(line, io.StringIO()) is None  # offered, none started yet
    standbys.close()


def test_the_next_build_runs_in_the_standby_its_last_one_left(tmp_path: Path) -> None:
    """Once a key was used, :meth:`refill` starts its standby; the next start writes the
    argv (spaces, quotes, a newline, a dollar) and the standby runs exactly it: its
    output goes to the build's stream, its exit status is the command's."""
    standbys = Standbys(Context())
    script = 'printf "%s|%s|%s|%s|\\n" "$@"; echo to-stderr >&2; exit 3'
    argv = ["sh", "-c", script, "sh", "a b", "it's", "two\nlines", "$HOME"]
    line = offered(standbys, argv)
    assert standbys.start(line, io.StringIO()) is None
    standbys.refill()
    pid = waiting(standbys)
    time.sleep(0.2)
    os.kill(pid, 0)  # waiting, not ended
    stream = io.StringIO()
    handed = standbys.start(line, stream)
    assert handed is not None and handed.key == "k"
    assert handed.running.wait() == 3 and handed.began()
    said = stream.getvalue()  # stdout and stderr (one write each), a thread reading each
    assert said.replace("to-stderr\n", "", 1) == "a b|it's|two\nlines|$HOME|\n", said
    assert standbys.start(line, io.StringIO()) is None  # used: none waits until a refill
    standbys.refill()
    assert waiting(standbys) != pid
    standbys.close()


def test_a_standby_started_ahead_runs_the_first_build_of_its_key(tmp_path: Path) -> None:
    """A prebuild starts one ahead for a build its look says will run, before the line
    is known (one per key, however often asked); the build then runs in it. One started
    ahead for nothing ends at the close having run nothing."""
    standbys = Standbys(Context())
    standbys.ahead("k", STANDBY_LINE)
    pid = waiting(standbys)
    standbys.ahead("k", STANDBY_LINE)
    assert waiting(standbys) == pid
    standbys.ahead("unused", STANDBY_LINE)
    unused = standbys._waiting["unused"].promise.runner.process
    line = offered(standbys, ["touch", str(tmp_path / "ran")])
    handed = standbys.start(line, io.StringIO())
    assert handed is not None and handed.running.pid == pid
    assert handed.running.wait() == 0
    assert (tmp_path / "ran").exists()
    standbys.close()
    assert unused.poll() == 0


def waiting_to_touch(marker: Path) -> tuple[Standbys, str, Any]:
    """Standbys with one waiting, to run ``touch marker``: them, the line, its process."""
    standbys = Standbys(Context())
    line = offered(standbys, ["touch", str(marker)])
    standbys.start(line, io.StringIO())
    standbys.refill()
    return standbys, line, standbys._waiting["k"].promise.runner.process


def test_a_standby_closed_unused_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    standbys, _, process = waiting_to_touch(marker)
    standbys.close()
    assert process.poll() == 0
    assert not marker.exists()


def test_a_standby_that_died_is_replaced_by_the_line_and_then_forgotten(tmp_path: Path) -> None:
    """Killed (its container removed, a stop of another run): the build runs its own line;
    a standby that ended unused is not started again until a build uses its key."""
    marker = tmp_path / "ran"
    standbys, line, process = waiting_to_touch(marker)
    process.kill()
    process.wait()
    assert standbys.start(line, io.StringIO()) is None
    assert not marker.exists()
    standbys.refill()  # wanted again by that start: a new one
    second = standbys._waiting["k"].promise.runner.process
    second.kill()
    second.wait()
    standbys.refill()  # ended unused: forgotten
    assert "k" not in standbys._waiting
    standbys.refill()
    assert "k" not in standbys._waiting
    standbys.close()


def test_a_shell_without_cat_ends_its_standby_at_once(tmp_path: Path) -> None:
    """The script reads its argv with ``cat``; an image without it never runs a build
    from an empty argv: the standby ends, and the build runs as a plain docker exec."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "sh").symlink_to("/bin/sh")
    done = subprocess.run(
        ["/bin/sh", "-c", STANDBY],
        input="touch never\n",
        env={"PATH": str(bare)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=10,
        check=False,
    )
    assert done.returncode == 0
    assert not (tmp_path / "never").exists()


def test_a_standby_killed_after_being_handed_its_command_says_it_never_began(
    tmp_path: Path,
) -> None:
    """A docker client learns of its exec's death only a moment later: a command handed
    to it then is never run, and the build can tell (it runs the line of its own then).
    The script here runs behind a parent that outlives it by 2 s, as that client does;
    the command it is handed, and the mark of a begun one, never reach the build."""
    pid_file = tmp_path / "script.pid"
    # An asynchronous list's stdin is /dev/null unless it is given another fd's.
    parent = 'exec 3<&0; sh -c "$1" <&3 3<&- & echo $! > "$2"; wait $!; s=$?; sleep 2; exit $s'
    lagging = shlex.join(["sh", "-c", parent, "sh", STANDBY, str(pid_file)])
    standbys = Standbys(Context())
    standbys.ahead("k", lagging)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text(encoding="utf-8").endswith("\n")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(int(pid_file.read_text(encoding="utf-8")), signal.SIGKILL)
    line = offered(standbys, ["touch", str(tmp_path / "ran")])
    stream = io.StringIO()
    handed = standbys.start(line, stream)
    assert handed is not None  # its client was still there
    assert handed.running.wait() == 128 + signal.SIGKILL
    assert not handed.began()
    assert not (tmp_path / "ran").exists()
    assert stream.getvalue() == ""
    standbys.close()
