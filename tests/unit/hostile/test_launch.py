"""The launch command: clear stale orphans, run the binary with the raw values, wait, clear.

The launched binary is itself a recorder, so the test sees the cwd, argv and
environment the program got. ``pkill``/``pgrep`` are recorders too, in three
set-ups: missing (a host without pkill), finding nothing, and finding orphans
that go on TERM; their pattern is then checked with a real ERE matcher.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fdl_tasks.config.names import join_path
from fdl_tasks.launch import launch_line
from fdl_tasks.publish.envelope import PerHostEnvelope
from tests.unit.hostile.conftest import (
    Call,
    Sandbox,
    checked_command,
    checked_crate_dir,
    commands,
    crate_dirs,
    env_names,
    good_arches,
    host_binary,
    label_segment,
    load,
    make_recorders,
    mostly,
    no_nul,
    one_worker,
    printable,
    sandbox,
)

#: How the host's pkill answers: missing from PATH, no process matched, orphans cleared.
PKILL_MODES = {"absent": {}, "idle": {"pkill": 1}, "orphans": {"pkill": 0, "pgrep": 1}}


#: Env names, often one both envs set, so that which one wins is put to the test.
launch_env_names = mostly(
    st.one_of(env_names, st.sampled_from(["LD_LIBRARY_PATH", "OMP_NUM_THREADS"]))
)


@pytest.fixture(scope="module")
def launch_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One ``PATH`` of recorders per pkill mode."""
    return {
        mode: make_recorders(tmp_path_factory.mktemp(f"launch-{mode}"), codes)
        for mode, codes in PKILL_MODES.items()
    }


def clearing(mode: str, pattern: str) -> list[tuple[str, tuple[str, ...]]]:
    """What clearing orphans runs: TERM; while any is left, wait; then KILL."""
    if mode == "absent":
        return []
    term: list[tuple[str, tuple[str, ...]]] = [("pkill", ("-TERM", "-f", pattern))]
    if mode == "idle":
        return term
    return [*term, ("pgrep", ("-f", pattern)), ("pkill", ("-KILL", "-f", pattern))]


def ere_matches(pattern: str, lines: Sequence[str]) -> list[bool]:
    """Which lines the POSIX extended regex ``pattern`` matches, as GNU grep -E decides."""
    done = subprocess.run(
        ["grep", "-n", "-E", "-e", pattern],
        input="".join(f"{line}\n" for line in lines).encode(),
        capture_output=True,
        env={"LC_ALL": "C.UTF-8"},
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    hits = {int(line.split(b":", 1)[0]) for line in done.stdout.splitlines()}
    return [number in hits for number in range(1, len(lines) + 1)]


def check_launch(
    box: Sandbox,
    bin_dir: Path,
    mode: str,
    path: str,
    label: str,
    arch: str,
    command: str,
    crate: str,
    cluster_env: Mapping[str, str],
    worker_env: Mapping[str, str],
    args: Sequence[str],
) -> bool:
    """Run one launch command; ``False`` if a gatekeeper refused the values (cleanly)."""
    cluster = load(
        {
            "controller": {"path": "/p"},
            "workers": [one_worker(path, label, arch, env=dict(worker_env))],
            "env": dict(cluster_env),
        },
        "workers[0].",
        "env[",
    )
    name, crate_dir = checked_command(command), checked_crate_dir(crate)
    if cluster is None or name is None or crate_dir is None:
        return False
    worker = cluster.workers[0]
    os.makedirs(join_path(path, crate_dir), exist_ok=True)
    entry = PerHostEnvelope.for_worker(worker, name, crate_dir)
    binary = host_binary(path, label, arch, name)
    box.install(binary)
    calls, _ = box.run(launch_line(worker, entry, cluster.env, args), bin_dir=bin_dir)

    # Nothing but the binary and the orphan clearing ran: no env(1), no stray command.
    pattern = calls[0].argv[-1] if mode != "absent" else ""
    clear = clearing(mode, pattern)
    assert [(c.name, c.argv) for c in calls] == [*clear, (name, tuple(args)), *clear]
    launched: Call = calls[len(clear)]
    assert launched.program == binary
    assert launched.cwd == os.path.realpath(join_path(path, crate_dir))
    if pattern:
        command_line = f"{binary} --epochs 3"
        others = [f"{binary}2", f"/bin/sh -c {binary}"]
        assert ere_matches(pattern, [binary, command_line, *others]) == [True, True, False, False]

    # The environment, by the documented rule: worker env over cluster env, and
    # LD_LIBRARY_PATH from the worker env, else the cluster env, else the envelope.
    seen = launched.env
    for variable, value in cluster_env.items():
        if variable not in worker_env:
            assert seen.get(variable) == value, variable
    for variable, value in worker_env.items():
        assert seen.get(variable) == value, variable
    if "LD_LIBRARY_PATH" in worker_env:
        library_path = worker_env["LD_LIBRARY_PATH"]
    elif "LD_LIBRARY_PATH" in cluster_env:
        library_path = cluster_env["LD_LIBRARY_PATH"]
    else:
        library_path = entry.ld_library_path
    assert seen.get("LD_LIBRARY_PATH") == library_path
    return True


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(sorted(PKILL_MODES)),
    suffix=printable,
    label=mostly(label_segment),
    arch=mostly(good_arches),
    command=mostly(commands),
    crate=mostly(crate_dirs),
    cluster_env=st.dictionaries(launch_env_names, no_nul, max_size=3),
    worker_env=st.dictionaries(launch_env_names, no_nul, max_size=3),
    args=st.lists(no_nul, max_size=4),
)
def test_launch_command_exports_raw_values_and_runs_the_binary(
    launch_paths: dict[str, Path],
    mode: str,
    suffix: str,
    label: str,
    arch: str,
    command: str,
    crate: str,
    cluster_env: dict[str, str],
    worker_env: dict[str, str],
    args: list[str],
) -> None:
    with sandbox(launch_paths[mode]) as box:
        path = box.path(suffix)
        ran = check_launch(
            box,
            launch_paths[mode],
            mode,
            path,
            label,
            arch,
            command,
            crate,
            cluster_env,
            worker_env,
            args,
        )
        assume(ran)  # refused cleanly (checked): draw an example that reaches the shell


@pytest.mark.parametrize("mode", sorted(PKILL_MODES))
def test_launch_command_worker_path_with_equals_sign(
    box: Sandbox, launch_paths: dict[str, Path], mode: str
) -> None:
    """A path with ``=`` once made env(1) exec the first user argument instead."""
    assert check_launch(
        box,
        launch_paths[mode],
        mode,
        box.path("run=1"),
        "node-a",
        "precompiled/cu128",
        "ddp-bench",
        "",
        {},
        {},
        ["--epochs", "3"],
    )


@pytest.mark.parametrize(
    ("cluster_env", "worker_env"),
    [
        ({}, {}),
        ({"LD_LIBRARY_PATH": "/c d"}, {}),
        ({}, {"LD_LIBRARY_PATH": "/w;x"}),
        ({"LD_LIBRARY_PATH": "/c", "X": "c", "Y": "c"}, {"LD_LIBRARY_PATH": "$(w)", "X": "w"}),
    ],
)
def test_launch_environment_is_worker_env_over_cluster_env_over_the_envelope(
    box: Sandbox,
    launch_paths: dict[str, Path],
    cluster_env: dict[str, str],
    worker_env: dict[str, str],
) -> None:
    assert check_launch(
        box,
        launch_paths["absent"],
        "absent",
        box.path("w"),
        "node-a",
        "precompiled/cu128",
        "ddp-bench",
        "",
        cluster_env,
        worker_env,
        [],
    )
