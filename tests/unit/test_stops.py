"""What a stop could not stop is named, with the command that does: a native build's
process group (real processes: the group is root's, the stopping process is ``nobody``'s),
and the containers of a daemon that does not answer; a docker client's own failure is said
as docker's, not cargo's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fdl_tasks.build.backends.containers import docker_exit_problem

# Imports as root, then becomes ``nobody``: the clone may sit where nobody cannot read
# (root's home, a ``mktemp -d`` directory), and only the stop must be nobody's.
SCRIPT = """
import os, sys, types
from fdl_tasks.build.backends.native import NativeBackend
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
job = types.SimpleNamespace(name="node-b")
print("\\n".join(NativeBackend(None, "cluster.yaml", "r1", None).stop_job(job, int(sys.argv[1]))))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become nobody")
def test_a_process_group_that_cannot_be_killed_is_named() -> None:
    build = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own group
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(build.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert build.poll() is None  # still running: nobody may not kill it
        assert done.stdout.strip() == (
            f"the build process group {build.pid} of node-b could not be stopped "
            f"([Errno 1] Operation not permitted); stop it with kill -KILL -- -{build.pid}"
        )
    finally:
        build.kill()
        build.wait()


def test_a_daemon_that_cannot_list_the_containers_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """No answer is not "nothing to remove": the run's containers may still run."""
    from fdl_tasks.build.docker_tools import remove_containers

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    [line] = remove_containers("fdl-tasks.run=ab12", "fdl-tasks.job=node b")
    assert line.startswith(
        "containers labelled fdl-tasks.run=ab12 fdl-tasks.job=node b may be left: "
        "the Docker daemon did not list them ("
    )
    assert line.endswith(
        "remove them with docker rm -f $(docker ps -aq --filter label=fdl-tasks.run=ab12 "
        "--filter label='fdl-tasks.job=node b')"
    )


def test_the_docker_clients_own_exit_is_not_called_cargos() -> None:
    lost = "   Compiling x v0.1.0\ndocker: error waiting for container: unexpected EOF\n"
    assert docker_exit_problem(125, lost) == (
        "docker exited 125 (the Docker daemon went away while the build ran: "
        "docker: error waiting for container: unexpected EOF)"
    )
    refused = "docker: Error response from daemon: no such image: x.\n"
    assert docker_exit_problem(125, refused) == (
        "docker exited 125 (docker could not run the build: "
        "docker: Error response from daemon: no such image: x.)"
    )
    assert docker_exit_problem(101, lost) is None  # cargo's own failure
    assert docker_exit_problem(137, lost) is None  # the container killed: said by signal
