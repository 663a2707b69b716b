"""The Docker daemon restarted while builds run, on a daemon of the test's own.

Other tests share the machine's daemon, so this one starts a second, real
``dockerd`` (own socket, data root, exec root and containerd:
:class:`rig.faults.PrivateDockerd`), copies the rig's builder image into it and
points ``inv`` at it with ``DOCKER_HOST``. Real sshd hosts, real cargo in the
containers; the fixture's build.rs sleeps so that the builds are in flight.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from rig.faults import PrivateDockerd, private_dockerd
from rig.harness import RigCluster, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("alpha", "127.0.0.211"),
    HostSpec("beta", "127.0.0.212"),
    HostSpec("gamma", "127.0.0.213"),
]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENVELOPE = "target/cluster/_envelopes/ddp-bench.json"


def shared_bridge_up() -> bool:
    """The shared daemon's ``docker0`` is still there (other runs build through it)."""
    return subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def dockerd() -> Iterator[PrivateDockerd]:
    had_bridge = shared_bridge_up()
    with private_dockerd() as daemon:
        yield daemon
    assert shared_bridge_up() or not had_bridge, "the private dockerd removed docker0"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("restart"), HOSTS, VARIANTS) as cluster:
        yield cluster


def test_daemon_restarted_while_builds_run(rig: RigCluster, dockerd: PrivateDockerd) -> None:
    """Every build in flight fails, named, the daemon named among what kills; exit 1; nothing
    published (the command's envelope was withdrawn before the builds); no container
    of the run left running once the daemon is back."""
    subprocess.run(["rm", "-rf", str(rig.project / "target")], check=True)
    archs = dict(zip([h.name for h in HOSTS], VARIANTS, strict=True))
    settings = {**rig.docker_settings(), "env": {"FDL_FIXTURE_BUILD_SLEEP": "60"}}
    path = rig.write(
        [rig.worker(h, arch=a) for h, a in archs.items()], "restart.yaml", docker=settings
    )
    env = {
        "DOCKER_HOST": dockerd.host,
        "INVOKE_FDL_COMPILE_CACHE": "0",
        "INVOKE_FDL_WARM_CONTAINERS": "0",  # a container per build (test_warm.py: warm ones)
    }
    run = rig.background(*prebuild_args(path, "--jobs", "3"), env=env)
    run.wait_for(lambda: "(run " in run.stderr, timeout=120)
    found = re.search(r"\(run ([0-9a-f]+):", run.stderr)
    assert found is not None
    label = f"label=fdl-tasks.run={found.group(1)}"

    def running() -> list[str]:
        return dockerd.docker("ps", "-q", "--filter", label).stdout.split()

    run.wait_for(lambda: len(running()) == 3, timeout=120)
    dockerd.restart()
    assert run.finish(timeout=120) == 1, run.stderr
    assert "Traceback" not in run.stderr
    paragraph = run.stderr[run.stderr.rindex("\nfdl: ") + 1 :]
    assert paragraph.startswith("fdl: 3 of 3 build(s) failed; no envelope was published."), (
        run.stderr
    )
    for host in archs:
        assert f" for {host} failed: " in paragraph
    # The docker client reports its container killed (137; 143 if it ended on the daemon's
    # SIGTERM), or loses the daemon first and exits 125 itself ("error waiting for
    # container: unexpected EOF", moby/moby#27987): a race of the daemon's shutdown. Each
    # names the daemon. Run 18 of the loop saw one build of three end otherwise than 137.
    failed = [line for line in paragraph.splitlines() if line.startswith("build ")]
    daemon = (
        "cargo exited 137 (killed by SIGKILL: ",
        "cargo exited 143 (killed by SIGTERM: ",
        "docker exited 125 (the Docker daemon went",
    )
    assert len(failed) == 3 and all(any(d in line for d in daemon) for line in failed), paragraph
    assert "Docker daemon" in paragraph
    assert not (rig.project / ENVELOPE).exists()
    assert running() == []
