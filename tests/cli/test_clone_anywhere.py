"""The suite passes wherever the repository is cloned (issue #39): a clone in a mode-700
directory (root's home, a ``mktemp -d``), where a test that runs something as another
user must not need that user to read the clone.

The clone and its virtual environment live in a mode-700 directory, as ``scripts/setup``
makes one in a clone there: the environment's interpreter is inside it. Its packages are
this environment's (a ``.pth`` file), and the clone's ``fdl_tasks`` comes first.
"""

from __future__ import annotations

import os
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs root (the unit tests that become another user) and a git checkout",
)
def test_the_unit_tests_pass_in_a_clone_in_a_private_directory(tmp_path: Path) -> None:
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    clone = private / "fdl-tasks"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    for changed in ("fdl_tasks", "tests"):  # this checkout's working tree, committed or not
        shutil.rmtree(clone / changed)
        shutil.copytree(
            ROOT / changed, clone / changed, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = private / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    (packages / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run(
        [str(venv / "bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"],
        cwd=clone,
        env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]
