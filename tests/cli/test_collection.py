"""The collection through the real ``inv`` entry point: composition, config, errors."""

from __future__ import annotations

import time
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from rig.harness import run_inv

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"
ROOT_TASKS = "from fdl_tasks import ns\n"
NESTED_TASKS = """\
from invoke import Collection, task
import fdl_tasks

@task
def hello(c):
    print("hello")

ns = Collection(hello)
ns.add_collection(fdl_tasks.ns, "fdl")
"""
COLLECTOR_TASKS = """\
import gc

from invoke import Collection, task

before = gc.get_stats()[0]["collections"]
import fdl_tasks
during = gc.get_stats()[0]["collections"] - before

@task
def collector(c):
    print(during, gc.isenabled(), gc.get_freeze_count() > 0)

ns = Collection(collector)
ns.add_collection(fdl_tasks.ns, "fdl")
"""
CLUSTER = """\
controller: {{path: {root}}}
workers:
  - {{host: {name}-a, path: /mnt/p, arch: precompiled/cu128, ssh: {{target: 127.0.0.9}}}}
  - {{host: {name}-b, path: /mnt/p, arch: precompiled/cpu}}
"""


def inv(cwd: Path, *args: str, env: dict[str, str] | None = None) -> CompletedProcess[str]:
    return run_inv(cwd, *args, env=env)


def project(tmp_path: Path, tasks: str, *names: str) -> Path:
    (tmp_path / "tasks.py").write_text(tasks)
    for name in names:
        (tmp_path / f"{name}.yaml").write_text(CLUSTER.format(root=tmp_path, name=name))
    return tmp_path


def test_root_composition_lists_and_documents_tasks(tmp_path: Path) -> None:
    root = project(tmp_path, ROOT_TASKS, "cluster")
    listed = inv(root, "--list")
    assert listed.returncode == 0
    for name in ("preflight", "build-host", "prebuild"):
        assert name in listed.stdout
    helped = inv(root, "--help", "prebuild")
    for option in ("--cmd", "--crate-dir", "--jobs", "--per-host", "--no-prebuild", "--json"):
        assert option in helped.stdout
    dry = inv(root, "--dry", "preflight")
    assert dry.returncode == 0, dry.stderr
    assert "[cluster-a] ssh 127.0.0.9:22" in dry.stderr


def test_inv_loads_the_tasks_with_the_collector_paused_then_frozen_and_on(tmp_path: Path) -> None:
    """The objects importing fdl-tasks makes live as long as ``inv``: the cyclic collector,
    which ran ~60 times over them, is paused while Invoke's loader imports the tasks (a
    few collections remain, in what is imported before the pause), then they are frozen
    and it is on again for the tasks."""
    done = inv(project(tmp_path, COLLECTOR_TASKS), "collector")
    assert done.returncode == 0, done.stderr
    during, enabled, frozen = done.stdout.split()
    assert int(during) < 15 and enabled == "True" and frozen == "True"


def test_nested_composition(tmp_path: Path) -> None:
    root = project(tmp_path, NESTED_TASKS, "cluster")
    assert "fdl.prebuild" in inv(root, "--list").stdout
    dry = inv(root, "--dry", "fdl.preflight")
    assert dry.returncode == 0, dry.stderr
    assert "[cluster-b] ssh cluster-b:22" in dry.stderr


def test_config_precedence(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        NESTED_TASKS + 'ns.configure({"fdl": {"cluster_file": "conf.yaml"}})\n',
        "conf",
        "yml",
        "env",
        "opt",
    )
    assert "[conf-a]" in inv(root, "--dry", "fdl.preflight").stderr
    (root / "invoke.yaml").write_text("fdl:\n  cluster_file: yml.yaml\n")
    assert "[yml-a]" in inv(root, "--dry", "fdl.preflight").stderr
    env = {"INVOKE_FDL_CLUSTER_FILE": "env.yaml"}
    assert "[env-a]" in inv(root, "--dry", "fdl.preflight", env=env).stderr
    by_option = inv(root, "--dry", "fdl.preflight", "--cluster-file", "opt.yaml", env=env)
    assert "[opt-a]" in by_option.stderr


def test_controller_label_from_env_and_option(tmp_path: Path) -> None:
    root = project(tmp_path, ROOT_TASKS, "cluster")
    by_env = inv(root, "--dry", "preflight", env={"FLODL_HOST_NAME": "cluster-a"})
    assert "[cluster-a] (local)" in by_env.stderr and "[cluster-a] ssh" not in by_env.stderr
    by_option = inv(
        root,
        "--dry",
        "preflight",
        "--controller-host",
        "cluster-b",
        env={"FLODL_HOST_NAME": "cluster-a"},
    )
    assert "[cluster-b] (local)" in by_option.stderr and "[cluster-a] ssh" in by_option.stderr
    numeric = inv(root, "--dry", "preflight", env={"INVOKE_FDL_CONNECT_TIMEOUT": "abc"})
    assert numeric.returncode != 0


@pytest.mark.parametrize("name", sorted(p.name for p in BAD.iterdir()))
def test_bad_cluster_files_through_inv(tmp_path: Path, name: str) -> None:
    root = project(tmp_path, ROOT_TASKS)
    started = time.monotonic()
    done = inv(root, "preflight", "--cluster-file", str(BAD / name))
    assert done.returncode == 1
    assert done.stderr.startswith("fdl: ") and str(BAD / name) in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    # one short paragraph, quickly, whatever the file holds ("billion laughs", 10 kB values)
    assert len(done.stderr) < 1500 and done.stderr.count("\n") == 1
    assert time.monotonic() - started < 20


def test_bad_setting_and_unknown_host(tmp_path: Path) -> None:
    root = project(tmp_path, ROOT_TASKS, "cluster")
    bad = inv(root, "build-host", "--host", "nope", "--cmd", "x")
    assert bad.returncode == 1 and "unknown host 'nope'" in bad.stderr
    assert "cluster-a, cluster-b" in bad.stderr
    jobs = inv(root, "prebuild", "--cmd", "x", "--jobs", "many")
    assert jobs.returncode == 1 and jobs.stderr == "--jobs expects a whole number, got 'many'\n"
    setting = inv(root, "prebuild", "--cmd", "x", env={"INVOKE_FDL_BUILD_JOBS": "-2"})
    assert setting.returncode == 1 and "fdl.build_jobs must be int" in setting.stderr
    cmd = inv(root, "prebuild", "--cmd", "x; rm -rf /")
    assert cmd.returncode == 1 and "not a valid binary name" in cmd.stderr
