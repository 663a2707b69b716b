"""Fixtures for tests against the ssh rig (real sshd per host, real ``inv`` runs).

The rig itself, its cluster files and its ``inv`` runs are :mod:`rig.harness`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rig.harness import Running


@pytest.fixture(autouse=True)
def no_background_inv() -> Iterator[None]:
    """A failed test must not leave an ``inv`` running: each one left is stopped."""
    yield
    Running.stop_all()
