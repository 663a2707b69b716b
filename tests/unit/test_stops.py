"""A native build's process group that cannot be stopped is named, with the command that
stops it (real processes: the group is root's, the stopping process is ``nobody``'s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = """
import sys, types
from fdl_tasks.backends.native import NativeBackend
job = types.SimpleNamespace(name="node-b")
print("\\n".join(NativeBackend(None).stop_job(job, "r1", int(sys.argv[1]), None)))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_process_group_that_cannot_be_killed_is_named() -> None:
    build = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own group
    try:
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        done = subprocess.run(
            [*nobody, sys.executable, "-c", SCRIPT, str(build.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert build.poll() is None  # still running: nobody may not kill it
        assert done.stdout.strip() == (
            f"the build process group {build.pid} of node-b could not be stopped "
            f"([Errno 1] Operation not permitted); stop it with kill -KILL -- -{build.pid}"
        )
    finally:
        build.kill()
        build.wait()
