"""Invoke's configuration-file mistakes worded, the cluster file's path resolved, and
close matches of a mistyped name (issue #31)."""

from __future__ import annotations

import pytest
import yaml

from fdl_tasks.config.config_errors import (
    key_line,
    merge_problem,
    misplaced_cluster_file,
    value_at,
    yaml_problem,
)
from fdl_tasks.config.settings import resolve_cluster_file
from fdl_tasks.core.suggest import close_matches, quoted_choice

TEXT = "# settings\nrun:\n  echo: true\nfdl:\n  # cluster_file: x.yml\ntasks:\n  dedupe: false\n"


def test_key_line_follows_nested_keys() -> None:
    assert key_line(TEXT, ["fdl"]) == 4
    assert key_line(TEXT, ["run", "echo"]) == 3
    assert key_line(TEXT, ["run", "absent"]) == 2  # the deepest key found
    assert key_line("{unclosed", ["fdl"]) is None


def test_an_emptied_section_names_its_line() -> None:
    problem = merge_problem("/p/invoke.yaml", TEXT, ["fdl"], None)
    assert problem.startswith(
        "/p/invoke.yaml, line 4: 'fdl' is empty (every line under it commented out?), but it "
        "must be a mapping of settings"
    )
    assert merge_problem("/p/invoke.yaml", "", ["run"], 3) == (
        "/p/invoke.yaml: 'run' is an integer (3), but it must be a mapping of settings: put its "
        "settings under it, or remove the line."
    )
    mapping = merge_problem("/p/invoke.yaml", "run:\n  echo: {a: 1}\n", ["run", "echo"], {"a": 1})
    assert mapping.startswith("/p/invoke.yaml, line 2: 'run.echo' is a mapping here")


def test_value_at() -> None:
    assert value_at({"a": {"b": None}}, ["a", "b"]) == (True, None)
    assert value_at({"a": 1}, ["a", "b"]) == (False, None)


def test_a_yaml_error_names_where_the_mistake_began() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        yaml.safe_load("fdl:\n  a: 1\n  b 2\n  c: 3\n")
    said = yaml_problem(caught.value, "invoke.yaml")
    assert said == (
        "invoke.yaml is not valid YAML at line 4, column 3: could not find expected ':' "
        "(while scanning a simple key at line 3, column 3)."
    )


def test_a_cluster_file_as_invoke_s_config_is_caught() -> None:
    assert misplaced_cluster_file([], "/p/settings.yaml", "prebuild") is None
    said = misplaced_cluster_file(["workers"], "c.yml", "prebuild")
    assert said is not None and said.endswith(
        "put -f after the task name, e.g. inv prebuild -f c.yml"
    )


@pytest.mark.parametrize(
    ("chosen", "given", "project", "expected"),
    [
        ("fdl.cluster.yml", False, "/srv/proj/", "/srv/proj/fdl.cluster.yml"),
        ("fdl.cluster.yml", True, "/srv/proj/", "fdl.cluster.yml"),  # -f: the shell's cwd
        ("/etc/c.yml", False, "/srv/proj/", "/etc/c.yml"),
        ("cluster.yaml", False, None, "cluster.yaml"),  # outside inv: the working directory
    ],
)
def test_the_cluster_file_s_path(
    chosen: str, given: bool, project: str | None, expected: str
) -> None:
    assert resolve_cluster_file(chosen, given, project) == expected


def test_close_matches() -> None:
    labels = ["node-blackwell", "node-pascal", "node-cpu"]
    assert close_matches("node-pascl", labels, cutoff=0.75) == ["node-pascal"]
    assert close_matches("ddp_bench", ["ddp-bench", "other"]) == ["ddp-bench"]
    assert close_matches("zzz", labels) == []
    assert quoted_choice(["a", "b", "c"]) == "'a', 'b' or 'c'"
