"""Every task's options: chosen short flags, typed values, ``--help``, usage errors.

The parsed options come from the tasks themselves (``get_arguments()``); help and
usage errors through the real ``inv`` entry point.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from invoke.parser.argument import Argument

from fdl_tasks import ns
from rig.harness import inv_argv, isolated_env, run_inv

TASKS = ("preflight", "build-host", "prebuild", "launch", "clean", "push-libtorch")


def arguments(task: str) -> list[Argument]:
    found: list[Argument] = ns[task].get_arguments()
    return found


def long_and_short(argument: Argument) -> tuple[str, str | None]:
    """The long name and the short flag (a one-character name), if any."""
    longs = [n for n in argument.names if len(n) > 1]
    shorts = [n for n in argument.names if len(n) == 1]
    assert len(longs) == 1 and len(shorts) <= 1, argument.names
    return longs[0], shorts[0] if shorts else None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "tasks.py").write_text("from fdl_tasks import ns\n")
    return tmp_path


def test_the_collection_has_exactly_these_tasks() -> None:
    assert sorted(ns.task_names) == sorted(TASKS)


def test_no_positional_arguments() -> None:
    """``inv prebuild --help`` is help, never the value of a positional ``cmd``."""
    for task in TASKS:
        assert [a.names for a in arguments(task) if a.positional] == [], task


def test_one_short_letter_means_one_long_option_everywhere() -> None:
    by_short: dict[str, set[str]] = {}
    by_long: dict[str, set[str | None]] = {}
    for task in TASKS:
        for argument in arguments(task):
            name, short = long_and_short(argument)
            by_long.setdefault(name, set()).add(short)
            if short is not None:
                by_short.setdefault(short, set()).add(name)
    clashes = {short: names for short, names in by_short.items() if len(names) > 1}
    assert clashes == {}
    # And a long option has the same short flag in every task, or none anywhere.
    assert {name: shorts for name, shorts in by_long.items() if len(shorts) > 1} == {}


def test_short_flags_are_single_letters() -> None:
    """No ``-`` (nor a digit or a symbol) as a short flag, and never ``-h``: that is help."""
    for task in TASKS:
        for argument in arguments(task):
            _, short = long_and_short(argument)
            if short is not None:
                assert re.fullmatch(r"[a-zA-Z]", short), (task, argument.names)
                assert short != "h", (task, argument.names)
            for name in argument.names:
                assert not name.startswith("-") and name.strip("-"), (task, argument.names)


def test_whole_number_options_are_ints() -> None:
    kinds = {a.name: a.kind for a in arguments("prebuild")}
    assert kinds["jobs"] is int
    assert kinds["timeout"] is int
    for task in TASKS:
        for argument in arguments(task):
            if argument.name in ("jobs", "timeout"):
                assert argument.kind is int, task


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--jobs", "abc"), "--jobs expects a whole number, got 'abc'"),
        (("-j", "abc"), "--jobs expects a whole number, got 'abc'"),
        (("--timeout", "1.5"), "--timeout expects a whole number, got '1.5'"),
    ],
)
def test_a_bad_number_is_one_clear_line(root: Path, args: tuple[str, ...], line: str) -> None:
    done = run_inv(root, "prebuild", "--cmd", "ddp-bench", *args)
    assert done.returncode == 1
    assert done.stderr.strip() == line
    assert done.stdout == ""
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_on_every_task(root: Path, task: str, flag: str) -> None:
    """Exit 0, the task's usage and every one of its options with its short flag."""
    done = run_inv(root, task, flag)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Usage: inv[oke] [--core-opts] {task} [--options]" in done.stdout
    docstring = ns[task].__doc__
    assert docstring and docstring.split()[0] in done.stdout
    for argument in arguments(task):
        name, short = long_and_short(argument)
        assert re.search(rf"(^|[ ,])--{re.escape(name)}\b", done.stdout, re.M), (name, done.stdout)
        if short is not None:
            shown = rf"-{short}( [A-Z]+)?, --{re.escape(name)}\b"
            assert re.search(shown, done.stdout), (short, name, done.stdout)


@pytest.mark.parametrize(
    ("args", "unbuffered"),
    [
        (("prebuild", "--help"), "1"),  # found gone by the print itself: the hook
        (("--list",), ""),  # found gone by the last flush of a buffered stdout: the exit handler
    ],
)
def test_output_to_a_reader_that_left_ends_quietly(
    root: Path, args: tuple[str, ...], unbuffered: str
) -> None:
    """``inv prebuild --help | head -1`` once head has read its line: exit 1, nothing on
    stderr (no traceback, no "Exception ignored"). The pipe's read end is closed before
    ``inv`` starts, so the first write to stdout finds its reader gone, every run."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            inv_argv(*args),
            cwd=root,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=isolated_env({"PYTHONUNBUFFERED": unbuffered}),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.stderr, done.returncode) == ("", 1)


def test_help_lists_the_expected_options(root: Path) -> None:
    """What each task must offer, by name (a renamed option fails here, not in a user's script)."""
    expected = {
        "preflight": {"cluster-file", "controller-host", "no-prebuild", "json"},
        "build-host": {"host", "cmd", "crate-dir", "cluster-file", "controller-host", "json"},
        "prebuild": {
            "cmd",
            "crate-dir",
            "cluster-file",
            "controller-host",
            "jobs",
            "no-prebuild",
            "per-host",
            "no-verify",
            "require-verified",
            "timeout",
            "watch",
            "json",
        },
        "launch": {"cmd", "cluster-file", "controller-host"},
        "clean": {"cluster-file", "controller-host", "dry", "all"},
    }
    for task, names in expected.items():
        have = {long_and_short(a)[0] for a in arguments(task)}
        assert names <= have, (task, names - have)
        helped = run_inv(root, task, "--help")
        assert helped.returncode == 0, helped.stderr
        for name in names:
            assert f"--{name}" in helped.stdout, (task, name)
