"""Shared test fixtures and paths.

How a test runs the real ``inv`` lives in :mod:`rig.harness` (shared with
``bench/`` and the demo); ``run_inv`` is also importable from here.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

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
