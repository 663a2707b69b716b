"""Notes said once: the first run after the cluster files or the note changed says it,
later runs keep it back, ``-v`` says every one."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke.context import Context

from fdl_tasks.config.loader import load_cluster
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.said_notes import cluster_digest, notes_file, parse_state, state_text, to_say

CLUSTER = cluster_digest([b"workers: [a, b]\n"])
GPU = "a, b: GPU coverage could not be checked: no nvidia-smi on the host"
DATA = "no data_path declared, and the default /flodl/data is missing on a, b"


def test_a_note_is_said_once_then_kept_back() -> None:
    said, state = to_say([GPU, DATA], "preflight", CLUSTER, {}, verbose=False)
    assert said == [GPU, DATA]
    again, kept = to_say([GPU, DATA], "preflight", CLUSTER, state, verbose=False)
    assert again == [] and kept == state


def test_verbose_says_every_note() -> None:
    _, state = to_say([GPU], "preflight", CLUSTER, {}, verbose=False)
    assert to_say([GPU], "preflight", CLUSTER, state, verbose=True)[0] == [GPU]


def test_a_changed_cluster_file_says_it_again() -> None:
    _, state = to_say([GPU], "preflight", CLUSTER, {}, verbose=False)
    edited = cluster_digest([b"workers: [a, b]\n# a comment\n"])
    assert to_say([GPU], "preflight", edited, state, verbose=False)[0] == [GPU]


def test_a_changed_fact_says_the_new_note_and_a_note_back_again() -> None:
    """A host's facts change a note's words (or which hosts it names); a note that went
    away for a run and came back is news again."""
    _, state = to_say([GPU], "preflight", CLUSTER, {}, verbose=False)
    fewer = "a: GPU coverage could not be checked: no nvidia-smi on the host"
    said, state = to_say([fewer], "preflight", CLUSTER, state, verbose=False)
    assert said == [fewer]
    assert to_say([GPU], "preflight", CLUSTER, state, verbose=False)[0] == [GPU]


def test_kinds_do_not_forget_each_other() -> None:
    _, state = to_say([GPU], "preflight", CLUSTER, {}, verbose=False)
    _, state = to_say(["note: hostname"], "controller", CLUSTER, state, verbose=False)
    assert to_say([GPU], "preflight", CLUSTER, state, verbose=False)[0] == []
    assert to_say(["note: hostname"], "controller", CLUSTER, state, verbose=False)[0] == []


def test_the_state_survives_its_file_and_garbage_is_nothing_said() -> None:
    _, state = to_say([GPU, DATA], "preflight", CLUSTER, {}, verbose=False)
    assert parse_state(state_text(state)) == state
    assert parse_state("{not json") == {}
    assert parse_state("[1, 2]") == {}
    assert parse_state('{"preflight": [1], "controller": ["x"]}') == {"controller": ["x"]}


def run_in(root: Path, cluster_file: Path, verbose: bool = False) -> Run:
    cluster_file.write_text(f"controller: {{path: {root}}}\nworkers: [{{host: a, path: {root}}}]\n")
    return Run(Context(), load_cluster(cluster_file), "a", Settings(verbose=verbose))


def test_a_run_remembers_what_it_said_per_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    one, two = tmp_path / "one.yml", tmp_path / "two.yml"
    assert run_in(tmp_path, one).notes_to_say("preflight", [GPU]) == [GPU]
    assert notes_file(str(tmp_path), str(tmp_path / "cache")).is_file()
    assert not (tmp_path / "target").exists()  # nothing in the project
    assert run_in(tmp_path, one).notes_to_say("preflight", [GPU]) == []
    assert run_in(tmp_path, two).notes_to_say("preflight", [GPU]) == [GPU]  # its own
    assert run_in(tmp_path, one).notes_to_say("preflight", [GPU]) == []  # not forgotten
    assert run_in(tmp_path, one, verbose=True).notes_to_say("preflight", [GPU]) == [GPU]


def test_a_missing_controller_path_is_never_made_for_the_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "not-mounted"
    run = run_in(root, tmp_path / "c.yml")
    assert run.notes_to_say("preflight", [GPU]) == [GPU]
    assert run.notes_to_say("preflight", [GPU]) == []
    assert not root.exists()
