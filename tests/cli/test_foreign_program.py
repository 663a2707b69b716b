"""fdl-tasks inside another Invoke program (issue #37): importing it and calling its API
from a worker thread leave the program's ``sys.excepthook``, signal handlers,
environment and garbage collector as they were.

The program runs in a process of its own, so that what it checks is its own
interpreter's state, not pytest's. Its prebuild is real: a cluster whose only
worker is the controller, so no host is contacted and no build is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fdl_tasks.config.launch_mode import ENV_PREBUILD_PER_HOST
from rig.harness import isolated_env

PROGRAM = """\
import gc, json, os, signal, sys, threading

import attrs
from invoke import Collection, Program, task

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def state():
    return (
        sys.excepthook,
        [signal.getsignal(s) for s in SIGNALS],
        dict(os.environ),
        gc.isenabled(),
        gc.get_freeze_count(),
    )


before = state()
import fdl_tasks
import fdl_tasks.api

seen = {{"after import": state() == before}}


@task
def ship(c):
    def work():
        try:
            settings = attrs.evolve(fdl_tasks.api.settings_of(c), compile_cache=False)
            published = fdl_tasks.api.prebuild(c, "x", settings=settings)
            seen["published"] = {{
                "hosts": list(published.hosts),
                "verdicts": [(v.host, v.status) for v in published.verdicts],
                "file": published.path.read_text().strip() == published.text,
            }}
        except BaseException as exc:
            seen["raised"] = repr(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()


ns = Collection(ship)
ns.add_collection(fdl_tasks.ns, "fdl")
ns.configure({{"fdl": {{"cluster_file": {cluster!r}}}}})
Program(namespace=ns, version="0").run(["program", "ship"], exit=False)
seen["after the run"] = state() == before
seen["variable"] = {variable!r} in os.environ
print(json.dumps(seen))
"""
CLUSTER = """\
controller: {{path: {root}}}
workers:
  - {{host: ctrl, path: {root}, arch: precompiled/cpu}}
"""


def test_a_prebuild_on_a_worker_thread_of_another_program_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(root=tmp_path))
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.rs").write_text("fn main() {}\n")
    (tmp_path / "libtorch" / "precompiled" / "cpu" / "lib").mkdir(parents=True)
    program = tmp_path / "program.py"
    cluster = str(tmp_path / "cluster.yaml")
    program.write_text(PROGRAM.format(cluster=cluster, variable=ENV_PREBUILD_PER_HOST))
    environment = {"FLODL_HOST_NAME": "ctrl", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=isolated_env(environment),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "raised" not in seen, seen["raised"]
    assert seen == {
        "after import": True,
        "published": {"hosts": [], "verdicts": [["ctrl", "ok"]], "file": True},
        "after the run": True,
        "variable": False,
    }
    assert "envelope of x for 0 host(s) written" in done.stderr
