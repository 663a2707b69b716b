"""Copy delivery to a host whose sshd has no ``Subsystem sftp``, through the real ``inv``.

The rig is :mod:`tests.rig.copy_rig`'s, but cp-a's sshd refuses SFTP (as hardened
images do): its binary goes over the ssh exec channel. cp-b still gets SFTP.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster
from rig.sshrig import HostSpec
from tests.rig.copy_rig import (
    ARCHS,
    binary,
    copy_rig,
    edit,
    interrupt_mid_upload,
    on_host,
    parts,
    prebuild,
    private_dir,
    sha,
)

pytestmark = pytest.mark.rig

ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"
EXEC_LINE = " over the ssh exec channel: the host refuses SFTP"


@pytest.fixture(scope="module")
def rig() -> Iterator[RigCluster]:
    specs = [
        HostSpec("cp-a", "127.0.0.120", user="fdlrig", sftp=False),
        HostSpec("cp-b", "127.0.0.121", user="fdlrig"),
        HostSpec("cp-shared", "127.0.0.122"),
    ]
    with copy_rig(specs) as cluster:
        yield cluster


def test_host_without_sftp_receives_and_runs_its_binary(rig: RigCluster) -> None:
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("copy: cp-a: sent") == 1, done.stderr
    assert done.stderr.count(EXEC_LINE) == 1, done.stderr  # cp-a only, once
    assert re.search(rf"^copy: cp-a: sent [\d.]+ MB in [\d.]+ s{EXEC_LINE}$", done.stderr, re.M)
    assert "3 host(s) verified" in done.stderr
    final = private_dir(rig, "cp-a") / binary("cp-a")
    assert sha(final) == sha(rig.project / binary("cp-a")) and os.access(final, os.X_OK)
    assert not parts(rig, "cp-a")
    entry = decode((rig.project / ENVELOPE).read_text(), ENVELOPE)["cp-a"]
    shown = rig.run_on_host("cp-a", str(private_dir(rig, "cp-a")), entry)
    assert shown == f"ddp-bench variant={ARCHS['cp-a']} cuda=on"


def test_an_edit_is_sent_again_over_the_exec_channel(rig: RigCluster) -> None:
    """Unchanged bytes send nothing; changed ones replace the file, which then runs."""
    again = prebuild(rig)
    assert again.returncode == 0, again.stderr
    assert "copy: cp-a: sent" not in again.stderr and EXEC_LINE not in again.stderr
    edit(rig, 9)
    done = prebuild(rig)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(EXEC_LINE) == 1, done.stderr
    assert sha(private_dir(rig, "cp-a") / binary("cp-a")) == sha(rig.project / binary("cp-a"))
    assert not parts(rig, "cp-a")
    view = private_dir(rig, "cp-a")
    lib = view / "libtorch" / ARCHS["cp-a"] / "lib"
    out, _ = on_host(rig, "cp-a", f"LD_LIBRARY_PATH={lib} {view / binary('cp-a')}").communicate(
        timeout=60
    )
    assert "edition=9" in out, out


def test_ctrl_c_mid_stream_leaves_the_old_binary_and_no_part(rig: RigCluster) -> None:
    """The stopped sender ends the input early: the host's checks remove the short part."""
    interrupt_mid_upload(rig, "cp-a", 10)
