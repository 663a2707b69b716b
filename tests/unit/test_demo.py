"""The demo (issue 39): its stop works from any directory, and a re-run keeps the
user's edits to the demo's crate and says so. Nothing here touches the shared demo rig:
the script runs in a copy whose ``.venv`` Python only records how it was called."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rig.demo import keep_edits, user_edits

ROOT = Path(__file__).resolve().parents[2]


def test_demo_down_stops_the_rig_from_any_directory(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts/demo", clone / "scripts/demo")
    python = clone / ".venv/bin/python3"
    python.parent.mkdir(parents=True)
    called = tmp_path / "called"
    python.write_text(f'#!/bin/sh\necho "$PWD $*" > {called}\n')
    python.chmod(0o755)
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    done = subprocess.run(
        [str(clone / "scripts/demo"), "--down"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert called.read_text() == f"{clone} -m rig.demo down\n"


def test_the_keep_message_names_an_absolute_stop_command() -> None:
    script = (ROOT / "scripts/demo").read_text()
    assert "Stop the rig (from any directory) with: $PWD/scripts/demo --down" in script
    assert script.index('cd "$(dirname "$0")/.."') < script.index("$PWD/scripts/demo --down")


def test_a_re_run_keeps_the_user_s_edits_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture, project = tmp_path / "fixture", tmp_path / "project"
    (fixture / "app/src").mkdir(parents=True)
    (fixture / "app/src/main.rs").write_text("fn main() {}\n")
    (fixture / "Cargo.toml").write_text("[workspace]\n")
    (fixture / "app/src/new.rs").write_text("// added to the fixture since\n")
    shutil.copytree(fixture, project, ignore=shutil.ignore_patterns("new.rs"))
    (project / "app/src/main.rs").write_text('fn main() { println!("mine"); }\n')
    edits = user_edits(project, fixture)
    assert list(edits) == [project / "app/src/main.rs"]
    shutil.copytree(fixture, project, dirs_exist_ok=True)  # the demo's layout, again
    keep_edits(edits, project)
    assert (project / "app/src/main.rs").read_text() == 'fn main() { println!("mine"); }\n'
    assert capsys.readouterr().out == (
        f"demo: kept your edits to app/src/main.rs in {project} (delete a file to get the "
        "demo's own back)\n"
    )
    keep_edits({}, project)
    assert capsys.readouterr().out == ""
