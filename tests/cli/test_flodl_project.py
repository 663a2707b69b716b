"""A flodl project as ``inv`` meets it (issue #42): the cluster block found by itself in
``fdl.yml`` and its overlay, and ``inv launch`` handing the envelope to flodl's launcher.

flodl's ``fdl`` cannot be built here (no crates.io), so a stand-in ``fdl`` on ``PATH``
records its argv, working directory and environment and exits with a chosen code. The
envelope is a published one (the file ``inv prebuild`` writes); the rig test
``tests/rig/test_flodl_launch.py`` publishes it with a real prebuild.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdl_tasks.config.launch_mode import ENV_PREBUILD_PER_HOST
from rig.harness import inv_argv, isolated_env, run_inv

FDL_YML = """\
description: a flodl project
commands:
  ddp-bench: {run: cargo run --release --bin ddp-bench}
"""
OVERLAY = """\
cluster:
  controller: {{host: {host}, path: {root}}}
  workers:
    - {{host: gpu-a, local_devices: [0], nccl_socket_ifname: lo, path: {root},
       arch: precompiled/cpu, ssh: {{target: 127.0.6.40}}}}
    - {{host: gpu-b, local_devices: [0], nccl_socket_ifname: lo, path: {root},
       arch: precompiled/cpu, ssh: {{target: 127.0.6.41}}}}
commands:
  ddp-bench: {{cluster: true}}
"""
ENVELOPE = {
    host: {
        "bin": f"target/cluster/{host}/precompiled-cpu/release/ddp-bench",
        "ld_library_path": "/srv/libtorch/precompiled/cpu/lib",
    }
    for host in ("gpu-a", "gpu-b")
}
#: The stand-in: argv, cwd and the envelope variable as JSON, then the exit code asked for.
STAND_IN = """\
#!{python}
import json, os, signal, sys, time
record = {{"argv": sys.argv[1:], "cwd": os.getcwd(),
          "envelope": os.environ.get("{variable}"), "fdl_env": os.environ.get("FDL_ENV")}}
with open({record!r}, "w") as out:
    json.dump(record, out)
print("fdl stand-in ran", flush=True)
if "--wait" in sys.argv:
    signal.signal(signal.SIGINT, lambda *_: sys.exit(42))
    time.sleep(60)
sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "tasks.py").write_text("from fdl_tasks import ns\n")
    (root / "fdl.yml").write_text(FDL_YML)
    (root / "fdl.cluster.yml").write_text(OVERLAY.format(host="10.0.0.1", root=root))
    published = root / "target/cluster/_envelopes/ddp-bench.json"
    published.parent.mkdir(parents=True)
    published.write_text(json.dumps(ENVELOPE, separators=(",", ":")) + "\n")
    return root


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A directory holding the stand-in ``fdl``; its record is ``<dir>/record.json``."""
    directory = tmp_path / "bin"
    directory.mkdir()
    fdl = directory / "fdl"
    record = directory / "record.json"
    fdl.write_text(
        STAND_IN.format(python=sys.executable, variable=ENV_PREBUILD_PER_HOST, record=str(record))
    )
    fdl.chmod(0o755)
    return directory


def with_path(directory: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{directory}:{os.environ['PATH']}", "FLODL_HOST_NAME": "ctrl", **extra}


def record(stand_in: Path) -> dict[str, object]:
    return json.loads((stand_in / "record.json").read_text())  # type: ignore[no-any-return]


def test_a_bare_preflight_reads_the_cluster_block_of_the_overlay(project: Path) -> None:
    done = run_inv(project / "target", "--dry", "preflight", env={"FLODL_HOST_NAME": "ctrl"})
    assert done.returncode == 0, done.stderr
    assert "[gpu-a] ssh 127.0.6.40:22 " in done.stderr
    assert "[gpu-b] ssh 127.0.6.41:22 " in done.stderr


def test_the_env_is_chosen_by_option_variable_and_setting(project: Path) -> None:
    (project / "fdl.vm.yml").write_text(
        OVERLAY.format(host="10.0.0.1", root=project).replace("127.0.6.4", "127.0.6.5")
    )
    chosen = {
        "--env": run_inv(project, "--dry", "preflight", "--env", "vm"),
        "FDL_ENV": run_inv(project, "--dry", "preflight", env={"FDL_ENV": "vm"}),
        "fdl.env": run_inv(project, "--dry", "preflight", env={"INVOKE_FDL_ENV": "vm"}),
    }
    for way, done in chosen.items():
        assert done.returncode == 0, (way, done.stderr)
        assert "[gpu-a] ssh 127.0.6.50:22 " in done.stderr, way
    beaten = run_inv(project, "--dry", "preflight", "--env", "cluster", env={"FDL_ENV": "vm"})
    assert "[gpu-a] ssh 127.0.6.40:22 " in beaten.stderr
    missing = run_inv(project, "--dry", "preflight", "--env", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith(
        "(expected fdl.nope.yml next to " + f"{project}/fdl.yml)"
    )


def test_launch_runs_flodl_s_launcher_with_the_published_envelope(
    project: Path, stand_in: Path
) -> None:
    done = run_inv(
        project, "launch", "--cmd", "ddp-bench", "--", "--epochs", "1", env=with_path(stand_in)
    )
    assert done.returncode == 0, done.stderr
    assert "fdl stand-in ran" in done.stdout
    seen = record(stand_in)
    assert seen["argv"] == ["@cluster", "ddp-bench", "--no-prebuild", "--epochs", "1"]
    assert seen["cwd"] == str(project)
    published = (project / "target/cluster/_envelopes/ddp-bench.json").read_text()
    assert seen["envelope"] == published.rstrip("\n")  # the published bytes, as flodl reads them


@pytest.mark.parametrize("code", [3, 42])
def test_flodl_s_exit_code_comes_back(project: Path, stand_in: Path, code: int) -> None:
    done = run_inv(
        project, "launch", "--cmd", "ddp-bench", env=with_path(stand_in, STAND_IN_EXIT=str(code))
    )
    assert done.returncode == code
    assert "Traceback" not in done.stderr


def test_ctrl_c_reaches_flodl_s_launcher_once_and_its_code_comes_back(
    project: Path, stand_in: Path
) -> None:
    process = subprocess.Popen(
        inv_argv("launch", "--cmd", "ddp-bench", "--", "--wait"),
        cwd=project,
        env=isolated_env(with_path(stand_in)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (stand_in / "record.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 42, stderr  # the stand-in's own answer to SIGINT


def test_no_fdl_on_path_is_one_line_naming_the_other_mode(project: Path, tmp_path: Path) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    done = run_inv(project, "launch", "--cmd", "ddp-bench", env={"PATH": f"{empty}:/usr/bin:/bin"})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fdl: fdl (flodl's command-line tool) is not on PATH")
    assert "--launcher direct" in last


def test_dry_launch_prints_the_fdl_line_and_the_variable(project: Path) -> None:
    done = run_inv(project, "--dry", "launch", "--cmd", "ddp-bench", "--", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    published = (project / "target/cluster/_envelopes/ddp-bench.json").read_text().rstrip("\n")
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        f"cd {project} && {ENV_PREBUILD_PER_HOST}='{published}' "
        "fdl @cluster ddp-bench --no-prebuild --epochs 1"
    )


def test_direct_mode_says_once_what_it_does_not_give(project: Path) -> None:
    done = run_inv(project, "--dry", "launch", "--cmd", "ddp-bench", "--launcher", "direct")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no world is formed") == 1
    assert "[gpu-a] cd " in done.stderr


def test_a_stale_envelope_is_refused_before_fdl_runs(project: Path, stand_in: Path) -> None:
    overlay = project / "fdl.cluster.yml"
    overlay.write_text(overlay.read_text().replace("gpu-b", "gpu-c"))
    done = run_inv(project, "launch", "--cmd", "ddp-bench", env=with_path(stand_in))
    assert done.returncode == 1
    assert "gpu-c has no entry" in done.stderr
    assert not (stand_in / "record.json").exists()


def test_launcher_fdl_on_a_cluster_yaml_project_is_refused(project: Path) -> None:
    (project / "cluster.yaml").write_text(
        f"controller: {{path: {project}}}\nworkers:\n"
        f"  - {{host: gpu-a, path: {project}, arch: precompiled/cpu}}\n"
    )
    done = run_inv(project, "--dry", "launch", "--cmd", "ddp-bench", "--launcher", "fdl")
    assert done.returncode == 1
    assert "is not read from one" in done.stderr


@pytest.mark.parametrize("forwarded", [False, True])
def test_preflight_warns_when_the_compose_service_drops_the_envelope(
    project: Path, forwarded: bool
) -> None:
    overlay = project / "fdl.cluster.yml"
    overlay.write_text(
        overlay.read_text().replace(
            "path: " + str(project) + "}", "path: " + str(project) + ", docker: cuda}", 1
        )
    )
    environment = ["CUDA_TAG", *(["FLODL_INTERNAL_PREBUILD_PER_HOST"] if forwarded else [])]
    (project / "docker-compose.yml").write_text(
        f"services:\n  cuda:\n    image: flodl-cuda:12.8\n    environment: {environment}\n"
    )
    done = run_inv(project, "preflight", "--no-prebuild", env={"FLODL_HOST_NAME": "ctrl"})
    said = "compose service 'cuda' (" + str(project / "docker-compose.yml") + ") does not forward"
    assert (said in done.stderr) is not forwarded, done.stderr
