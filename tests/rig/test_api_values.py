"""``fdl_tasks.api.prebuild`` on the rig, from a worker thread (issue #37): real hosts, one
shared native build, and what comes back is the API's own values, each host's binary
as published and verified; the process's handlers and environment are left as they were.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

import pytest
from invoke.context import Context

from fdl_tasks import HostBinary, Published, Settings, prebuild
from rig.harness import RIG_BUDGETS, RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [HostSpec("left", "127.0.0.66"), HostSpec("right", "127.0.0.67")]
ARCH = "precompiled/cu126"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("api"), HOSTS, [ARCH]) as cluster:
        yield cluster


def on_a_thread(settings: Settings) -> Published | None:
    """``prebuild`` run on a thread of its own, as a server's request would run it."""
    done: list[Published | BaseException | None] = []

    def work() -> None:
        try:
            done.append(prebuild(Context(), "ddp-bench", settings=settings))
        except BaseException as exc:
            done.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def test_prebuild_from_a_thread_returns_each_host_s_binary(rig: RigCluster) -> None:
    path = rig.write([rig.worker(h.name, arch=ARCH) for h in HOSTS], "api.yaml")
    settings = Settings(
        cluster_file=str(path),
        controller_host="ctrl",
        known_hosts=str(rig.known_hosts),
        global_known_hosts=str(rig.root / "no-global-known-hosts"),
        ssh_config=str(rig.root / "no-ssh-config"),
        system_ssh_config=str(rig.root / "no-system-ssh-config"),
        connect_timeout=float(RIG_BUDGETS["INVOKE_FDL_CONNECT_TIMEOUT"]),
        probe_timeout=float(RIG_BUDGETS["INVOKE_FDL_PROBE_TIMEOUT"]),
        compile_cache=False,
    )
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    hook, environment = sys.excepthook, dict(os.environ)
    first = on_a_thread(settings)
    again = on_a_thread(settings)
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers
    assert sys.excepthook is hook and dict(os.environ) == environment
    assert first is not None and again is not None
    assert first.path.read_text().strip() == first.text == again.text
    assert [v.host for v in first.verdicts] == ["ctrl", "left", "right"]  # the controller too
    assert {v.status for v in first.verdicts} <= {"ok", "warning"}
    for host, one in zip(HOSTS, first.hosts, strict=True):
        sha256 = hashlib.sha256((rig.project / one.binary).read_bytes()).hexdigest()
        variant = ARCH.replace("/", "-")
        assert one == HostBinary(
            host=host.name,
            binary=f"target/cluster/{host.name}/{variant}/release/ddp-bench",
            sha256=sha256,
            rebuilt=True,  # a fresh project: cargo built it
            verified=True,
            delivery="shared",
        )
    assert len({h.sha256 for h in first.hosts}) == 1  # one shared build for both
    assert [h.rebuilt for h in again.hosts] == [False, False]  # nothing changed since
