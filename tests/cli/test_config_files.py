"""Invoke's configuration files and the cluster file, as the real ``inv`` meets them in a
project (issue #31): ordinary mistakes in ``invoke.yaml`` are one paragraph naming the
file and line, ``-f`` before the task name is caught, a subdirectory finds the project's
cluster file. ``inv --dry preflight`` reads everything and contacts no host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rig.harness import run_inv

CLUSTER = """\
controller:
  path: {root}
workers:
  - host: w1
    ssh: {{target: 127.0.6.30}}
    path: {root}
    arch: precompiled/cpu
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project as the quick start wires it: tasks.py, invoke.yaml, rig.yml."""
    (tmp_path / "tasks.py").write_text("from fdl_tasks import ns\n")
    (tmp_path / "invoke.yaml").write_text("fdl: {cluster_file: rig.yml}\n")
    (tmp_path / "rig.yml").write_text(CLUSTER.format(root=tmp_path))
    (tmp_path / "src" / "deep").mkdir(parents=True)
    return tmp_path


def dry_preflight(cwd: Path, *before: str) -> tuple[int, str, str]:
    done = run_inv(cwd, *before, "--dry", "preflight")
    return done.returncode, done.stdout, done.stderr


def test_a_subdirectory_reads_the_project_s_cluster_file(project: Path) -> None:
    code, _, stderr = dry_preflight(project / "src" / "deep")
    assert code == 0, stderr
    assert "[w1] ssh 127.0.6.30:22 " in stderr
    assert f"names no host of {project}/rig.yml" in stderr


def test_a_cluster_file_on_the_command_line_is_relative_to_the_working_directory(
    project: Path,
) -> None:
    (project / "src" / "other.yml").write_text(
        CLUSTER.format(root=project).replace("127.0.6.30", "127.0.6.31")
    )
    done = run_inv(project / "src", "--dry", "preflight", "-f", "other.yml")
    assert done.returncode == 0, done.stderr
    assert "[w1] ssh 127.0.6.31:22 " in done.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # a section emptied by a comment
            "# settings\nfdl:\n  # cluster_file: fdl.cluster.yml\n",
            "invoke.yaml, line 2: 'fdl' is empty (every line under it commented out?), but "
            "it must be a mapping of settings",
        ),
        (  # a missing colon: a string where the settings go
            "fdl:\n  cluster_file fdl.cluster.yml\n",
            "invoke.yaml, line 1: 'fdl' is a string ('cluster_file fdl.cluster.yml'), but it "
            "must be a mapping of settings",
        ),
        (  # a missing colon in a longer section: not YAML
            "fdl:\n  known_hosts: /tmp/kh\n  cluster_file fdl.cluster.yml\n  timings: true\n",
            "invoke.yaml is not valid YAML at line 4, column 3: could not find expected ':' "
            "(while scanning a simple key at line 3, column 3).",
        ),
        (  # an unclosed brace
            "fdl: {cluster_file: fdl.cluster.yml\n",
            "invoke.yaml is not valid YAML at line 2, column 1: expected ',' or '}'",
        ),
        (  # every colon missing: the whole file one string
            "fdl cluster_file=fdl.cluster.yml\n",
            "invoke.yaml: the file is a string ('fdl cluster_file=fdl.cluster.yml'), but it "
            "must be a mapping of settings",
        ),
        (  # a list where the settings go
            "- fdl\n- cluster_file\n",
            "invoke.yaml: the file is a list (['fdl', 'cluster_file']), but it must be a "
            "mapping of settings",
        ),
    ],
)
def test_an_invoke_yaml_mistake_is_one_paragraph(project: Path, text: str, expected: str) -> None:
    (project / "invoke.yaml").write_text(text)
    code, stdout, stderr = dry_preflight(project)
    assert code == 1
    assert stdout == ""
    assert stderr.startswith(f"fdl: {project}/{expected}"), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr


def test_f_before_the_task_name_is_caught(project: Path) -> None:
    """Invoke takes it as its own --config: the cluster file's keys land in its config."""
    other = project / "cluster.yaml"
    other.write_text(CLUSTER.format(root=project).replace("127.0.6.30", "127.0.6.32"))
    for path in (other, project / "rig.yml"):
        code, _, stderr = dry_preflight(project, "-f", str(path))
        assert code == 1
        assert stderr == (
            f"fdl: {path} was read as Invoke's configuration (-f before the task name is "
            "Invoke's --config), not as the cluster file: put -f after the task name, e.g. "
            f"inv preflight -f {path}\n"
        )
    wrapped = project / "wrapped.yml"  # flodl's form: everything under ``cluster:``
    wrapped.write_text(
        "cluster:\n" + "".join(f"  {x}\n" for x in CLUSTER.format(root=project).splitlines())
    )
    assert "put -f after the task name" in dry_preflight(project, "-f", str(wrapped))[2]
    settings = project / "settings.yaml"  # a real Invoke config file there is fine
    settings.write_text("run: {echo: true}\n")
    code, _, stderr = dry_preflight(project, "-f", str(settings))
    assert code == 0, stderr
