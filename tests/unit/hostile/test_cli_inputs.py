"""Command-line inputs: ``--cmd`` and ``--crate-dir``, checked alone and through ``inv``.

An accepted command is one file name that cargo cannot take for an option; an
accepted crate directory stays inside the project root. (The build, remote
and launch tests run accepted ones through the shell.)
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fdl_tasks.config.layout import host_binary as binary_path
from tests.conftest import REPO, run_inv
from tests.unit.hostile.conftest import (
    MARKER,
    checked_command,
    checked_crate_dir,
    commands,
    crate_dirs,
    hostile,
    labels,
)


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(hostile, commands, labels))
def test_check_command_accepts_only_file_names(name: str) -> None:
    accepted = checked_command(name)
    if accepted is None:
        return
    assert accepted not in ("", ".", "..") and "/" not in accepted and "\x00" not in accepted
    assert not accepted.startswith("-"), "cargo would read it as an option"
    binary = os.path.normpath(binary_path("node-a", "precompiled/cu128", accepted))
    assert binary.split("/")[-2:] == ["release", accepted]


@settings(max_examples=300, deadline=None)
@given(
    relative=st.one_of(
        hostile,
        crate_dirs,
        st.lists(st.one_of(hostile, st.sampled_from(["..", ".", "", "a"])), max_size=3).map(
            "/".join
        ),
    )
)
def test_check_crate_dir_accepts_only_relative_paths_inside_the_root(relative: str) -> None:
    cleaned = checked_crate_dir(relative)
    if cleaned is None:
        return
    assert not cleaned.startswith("/") and not cleaned.endswith("/")
    segments = cleaned.split("/") if cleaned else []
    assert ".." not in segments and "." not in segments
    assert os.path.normpath(f"root/{cleaned}") == ("root/" + cleaned).rstrip("/")


def inv(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_inv(cwd, *args, env={"PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def cli_project() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fdl-cli-") as base:
        root = Path(base)
        (root / "tasks.py").write_text("from fdl_tasks import ns\n")
        (root / "Cargo.toml").write_text("[package]\n")
        (root / "cluster.yaml").write_text(
            f"controller: {{path: {root}}}\n"
            "workers:\n  - {host: node-a, path: /mnt/p, arch: precompiled/cu128}\n"
        )
        yield root


def assert_clean_refusal(done: subprocess.CompletedProcess[str], project: Path) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("fdl: "), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not list(project.rglob(f"*{MARKER}*"))
    assert not (project / "target").exists()
    return done.stderr


@pytest.mark.parametrize(
    "cmd",
    [
        f"x; touch {MARKER}",
        f"$(touch {MARKER})",
        "../../bin/sh",
        "-rf",
        "ddp bench",
        "ddp\nbench",
        "bench\x1b[31m",
    ],
)
def test_hostile_cmd_exits_1_with_one_message(cli_project: Path, cmd: str) -> None:
    stderr = assert_clean_refusal(inv(cli_project, "prebuild", f"--cmd={cmd}"), cli_project)
    assert stderr.startswith(f"fdl: command {cmd!r} is not a valid binary name")


@pytest.mark.parametrize(
    "crate", ["../outside", "/etc", f"a/$(touch {MARKER})", "a/../../b", "a//b"]
)
def test_hostile_crate_dir_exits_1_with_one_message(cli_project: Path, crate: str) -> None:
    done = inv(cli_project, "prebuild", "--cmd=ddp-bench", f"--crate-dir={crate}")
    stderr = assert_clean_refusal(done, cli_project)
    assert stderr.startswith(f"fdl: crate directory {crate!r} must be a relative path")
