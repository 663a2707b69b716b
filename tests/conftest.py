"""Shared test helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def isolated_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the caller's own fdl settings, plus ``extra``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_", "FLODL_"))}
    environment.update(extra or {})
    return environment


def run_inv(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The real ``inv`` entry point, as a user runs it, in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        env=isolated_env(env),
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def write_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a cluster.yaml from text and return its path."""

    def write(text: str, name: str = "cluster.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
