"""Shared test fixtures and paths.

How a test runs the real ``inv`` lives in :mod:`rig.harness` (shared with
``bench/`` and the demo); ``run_inv`` is also importable from here.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from fdl_tasks.core.locks import process_running
from rig.faults import unmount_leftovers
from rig.harness import run_inv

__all__ = ["DATA", "REPO", "run_inv"]

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# A shell starts a background job (``scripts/test &``, ``nohup … &``) with Ctrl-C
# ignored, and an ignored signal stays ignored through exec: every ``inv`` the tests
# start would then ignore the SIGINT a test sends it. The tests' children get
# Ctrl-C's default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: Base temp dirs of ended sessions kept to look at after a failure, as pytest keeps them.
KEPT_SESSIONS = 2


def pytest_configure(config: pytest.Config) -> None:
    """Each session a base temp dir of its own (unless ``--basetemp`` names one).

    pytest's own are numbered dirs in ``/tmp/pytest-of-<user>``, which every session
    makes mode 0700 as it starts. A rig whose hosts log in as ``fdlrig`` gives its
    dir's ancestors the other-execute bit, and a second session started meanwhile (a
    unit test run beside the rig's) took it away: those logins then failed with
    "Permission denied (publickey)". These live in ``<tmp>/fdl-pytest-of-<user>/<pid>``,
    whose mode no session changes.
    """
    if config.option.basetemp is None:
        config.option.basetemp = str(session_base())


def session_base() -> Path:
    """This session's base temp dir; those of sessions no longer running are removed,
    but the newest :data:`KEPT_SESSIONS`."""
    root = Path(tempfile.gettempdir()) / f"fdl-pytest-of-{getpass.getuser()}"
    root.mkdir(mode=0o711, exist_ok=True)
    if root.stat().st_uid != os.getuid():
        raise pytest.UsageError(f"{root} belongs to another user: pass --basetemp")
    ended = [d for d in root.iterdir() if d.name.isdigit() and not process_running(int(d.name))]
    for old in sorted(ended, key=lambda d: d.stat().st_mtime)[:-KEPT_SESSIONS]:
        unmount_leftovers(old)
        shutil.rmtree(old, ignore_errors=True)
    return root / str(os.getpid())


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run killed during a fault test leaves a tmpfs mounted in its ``--basetemp``;
    pytest would then fail to clear that directory, and every test of this run with it."""
    if session.config.option.basetemp:
        unmount_leftovers(Path(session.config.option.basetemp))


@pytest.fixture
def write_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a cluster.yaml from text and return its path."""

    def write(text: str, name: str = "cluster.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
