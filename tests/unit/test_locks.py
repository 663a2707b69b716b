"""The one flock helper and the process-wide logging settings (real files, real flock)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.locks import FileLock, create_lock, project_lock
from fdl_tasks.core.reporting import collect
from fdl_tasks.ssh.login_facts import quiet_paramiko

HOLD = (
    "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
    "f.write('pid 4242'); f.flush(); print('held', flush=True); time.sleep(30)"
)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """Another process holding ``lock`` exclusively, as a running prebuild does."""
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield path
    holder.kill()
    holder.wait()


def test_a_busy_lock_is_not_taken_and_names_its_holder(held: Path) -> None:
    with FileLock.create(held) as lock:
        assert lock.take() is False
        assert lock.take(shared=True) is False
        assert lock.holder() == "pid 4242"


def test_every_flock_is_the_helper_s() -> None:
    """No module but :mod:`fdl_tasks.core.locks` calls ``flock``: one helper, one way to
    lock (the sccache start-up's ``flock(1)`` runs in the build's shell, not here)."""
    package = Path(__file__).resolve().parents[2] / "fdl_tasks"
    callers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "fcntl" in path.read_text() and path.name != "locks.py"
    )
    assert callers == []


def test_a_free_lock_is_taken_and_claimed(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "lock"
    with FileLock.create(path) as lock:
        assert lock.take()
        lock.claim()
    assert path.read_text().startswith("pid ")
    assert FileLock.existing(tmp_path / "absent") is None


def test_the_project_lock_waits_for_the_holder_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    brief = HOLD.replace("time.sleep(30)", "time.sleep(0.5)")
    holder = subprocess.Popen([sys.executable, "-c", brief, str(path)], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    lines: list[str] = []
    started = time.monotonic()
    with project_lock(path, collect(lines)):
        waited = time.monotonic() - started
    holder.wait()
    assert waited > 0.2  # taken only once the holder let go
    assert len(lines) == 1 and "(pid 4242)" in lines[0] and "waiting" in lines[0]


def test_the_project_lock_is_taken_when_free(tmp_path: Path) -> None:
    lines: list[str] = []
    with (
        project_lock(tmp_path / "lock", collect(lines)),
        FileLock.create(tmp_path / "lock") as other,
    ):
        assert not other.take()
    assert lines == []


def test_an_unwritable_tree_is_one_message(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FdlError, match="target tree is not writable"):
        create_lock(tmp_path / "file" / "lock")


def test_quiet_paramiko_leaves_the_host_applications_logger_alone() -> None:
    quiet_paramiko()
    quiet_paramiko()
    transport = logging.getLogger("paramiko.transport")
    assert sum(1 for f in transport.filters if type(f).__name__ == "_NoHandshakeTracebacks") == 1
    assert logging.getLogger("paramiko").propagate
    assert logging.getLogger("paramiko").handlers == []
    error = transport.makeRecord("paramiko.transport", logging.ERROR, "", 0, "tb", (), None)
    info = transport.makeRecord("paramiko.transport", logging.INFO, "", 0, "ok", (), None)
    assert not transport.filter(error)
    assert transport.filter(info)
