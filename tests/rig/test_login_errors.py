"""A misconfigured login is an error; a host down is a warning; nothing verified fails.

Through the real ``inv`` against a real sshd: a key the host refuses, an identity
file that is the ``.pub`` half, no key at all (``HOME`` an empty directory, no
agent), a port where an HTTP server or a plain TCP echo server answers (each a
small Python server of this test's own, on that port), a port where nothing
listens. Then ``prebuild`` with every host down, ``--no-verify``, and the one line
that says which host keys ``accept-new`` remembered.
"""

from __future__ import annotations

import http.server
import json
import shlex
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rig.harness import RigCluster, Running, prebuild_args, start_rig
from rig.sshrig import HostSpec
from tests.rig.test_watch import set_rev, wait_cycle

pytestmark = pytest.mark.rig

HOSTS = [HostSpec("good", "127.0.6.1"), HostSpec("down", "127.0.6.2", listen="none")]
WEB, ECHO = ("127.0.6.3", 2222), ("127.0.6.4", 2222)
VARIANT = "precompiled/cpu"
#: Builds here are native cargo; no sccache server outlives a test.
NATIVE = {"INVOKE_FDL_COMPILE_CACHE": "0"}
#: Seconds a watch cycle may take (one native build on a shared machine).
CYCLE_BUDGET = 240


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    servers = [http.server.ThreadingHTTPServer(WEB, _Quiet), _EchoServer(ECHO, _Echo)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with start_rig(tmp_path_factory.mktemp("login"), HOSTS, [VARIANT]) as cluster:
            yield cluster
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def worker(rig: RigCluster, name: str, **ssh: Any) -> dict[str, Any]:
    """A rig host's entry with ``ssh`` fields changed (``None`` removes one)."""
    entry = rig.worker(name, arch=VARIANT)
    entry["ssh"] = {k: v for k, v in {**entry["ssh"], **ssh}.items() if v is not None}
    return entry


def elsewhere(rig: RigCluster, name: str, address: tuple[str, int]) -> dict[str, Any]:
    """An entry for a port of this test's own servers (no sshd there)."""
    target, port = address
    return worker(rig, "good", target=target, port=port) | {"host": name}


def preflight(
    rig: RigCluster, workers: list[dict[str, Any]], name: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    path = rig.write(workers, f"{name}.yaml")
    done = rig.inv("preflight", "--json", "--cluster-file", str(path), env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done, {v["host"]: v for v in json.loads(done.stdout)} if done.stdout else {}


def by_hand(reason: str) -> list[str]:
    """The line to try by hand at the end of a reason, as the shell splits it."""
    return shlex.split(reason.rsplit("; try by hand: ", 1)[1])


def other_key(rig: RigCluster) -> Path:
    key = rig.root / "other key" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
            capture_output=True,
        )
    return key


def test_a_key_the_host_refuses_is_an_error_that_names_the_key(rig: RigCluster) -> None:
    key = other_key(rig)
    done, got = preflight(rig, [worker(rig, "good", identity_file=str(key))], "wrong-key")
    assert done.returncode == 4, done.stderr
    verdict = got["good"]
    assert verdict["status"] == "error" and verdict["failure"] == "auth", verdict
    reason = verdict["errors"][0]
    assert reason.startswith(
        f"authentication refused at 127.0.6.1:2222 for user root (keys offered: {key}): "
    ), reason
    line = ["ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-p", "2222"]
    assert by_hand(reason) == [*line, "root@127.0.6.1", "true"]
    assert "unreachable" not in done.stderr
    # flodl's behaviour, asked for: a warning, exit 0, the same words.
    done, got = preflight(
        rig,
        [worker(rig, "good", identity_file=str(key))],
        "wrong-key-warn",
        INVOKE_FDL_SSH_LOGIN_ERRORS="warn",
    )
    assert done.returncode == 0, done.stderr
    assert got["good"]["status"] == "warning" and got["good"]["failure"] == "auth"
    assert got["good"]["warnings"][0] == f"{reason} (a warning: fdl.ssh_login_errors is warn)"


def test_the_public_half_as_identity_file_is_an_error(rig: RigCluster) -> None:
    private = rig.rig.client_key
    public = f"{private}.pub"
    done, got = preflight(rig, [worker(rig, "good", identity_file=public)], "pub")
    assert done.returncode == 4, done.stderr
    assert got["good"]["failure"] == "key_file", got["good"]
    reason = got["good"]["errors"][0]
    assert reason.startswith(
        f"ssh.identity_file {public} is a public key: point it at the private key ({private}, "
    ), reason
    assert by_hand(reason)[:5] == ["ssh", "-i", str(private), "-o", "IdentitiesOnly=yes"]
    # A file that is not there: the same kind of error, on that host's line.
    gone = rig.root / "no such key"
    done, got = preflight(
        rig, [worker(rig, "good", identity_file=str(gone)), worker(rig, "down")], "gone"
    )
    assert done.returncode == 4, done.stderr
    assert got["good"]["errors"][0].startswith(
        f"ssh.identity_file {gone} does not exist (to log in to 127.0.6.1:2222 as root); "
    ), got["good"]
    assert got["down"]["failure"] == "unreachable"


def test_no_key_at_all_is_an_error(rig: RigCluster) -> None:
    home = rig.root / "empty-home"
    home.mkdir(exist_ok=True)
    done, got = preflight(
        rig, [worker(rig, "good", identity_file=None)], "no-key", HOME=str(home), SSH_AUTH_SOCK=""
    )
    assert done.returncode == 4, done.stderr
    reason = got["good"]["errors"][0]
    assert reason.startswith(
        "no key to log in to 127.0.6.1:2222 as root: no ssh.identity_file, no ssh agent "
        "and no ~/.ssh/id_* key; set ssh.identity_file"
    ), reason
    assert by_hand(reason) == ["ssh", "-p", "2222", "root@127.0.6.1", "true"]


def test_a_port_that_is_not_ssh_is_an_error_and_a_host_down_a_warning(rig: RigCluster) -> None:
    workers = [elsewhere(rig, "web", WEB), elsewhere(rig, "echo", ECHO), worker(rig, "down")]
    done, got = preflight(rig, [*workers, worker(rig, "good")], "ports")
    assert done.returncode == 4, done.stderr
    assert got["good"]["status"] == "ok"
    web, echo, down = got["web"], got["echo"], got["down"]
    assert web["failure"] == echo["failure"] == "not_ssh", (web, echo)
    assert web["errors"][0].startswith(
        "127.0.6.3:2222 answers, but not as an SSH server (it said '<!DOCTYPE HTML>'): "
        "check that 2222 is its sshd's port (ssh.port, or Port in an ssh_config); try by hand: "
    ), web
    assert echo["errors"][0].startswith(
        "127.0.6.4:2222 answers, but not as an SSH server (Expecting packet from (31,), got 30)"
    ), echo
    assert down["status"] == "warning" and down["failure"] == "unreachable", down
    assert down["warnings"] == ["unreachable: connection refused at 127.0.6.2:2222"]
    # A host down alone: a warning, exit 0.
    done, got = preflight(rig, [worker(rig, "down"), worker(rig, "good")], "down-only")
    assert done.returncode == 0, done.stderr
    assert got["down"]["status"] == "warning"


def test_accept_new_says_which_keys_it_remembered(rig: RigCluster) -> None:
    rig.known_hosts.unlink(missing_ok=True)
    line = (
        "permanently added '[127.0.6.1]:2222' (ED25519) to the list of known hosts "
        f"({rig.known_hosts}; StrictHostKeyChecking accept-new)"
    )
    done, _ = preflight(rig, [worker(rig, "good")], "tofu")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines().count(line) == 1, done.stderr
    assert rig.known_hosts.read_text() == rig.rig.known_hosts_line("good") + "\n"
    done, _ = preflight(rig, [worker(rig, "good")], "tofu")
    assert "permanently added" not in done.stderr, done.stderr


def test_prebuild_with_every_host_down_fails_and_builds_nothing(rig: RigCluster) -> None:
    path = rig.write([worker(rig, "down")], "all-down.yaml")
    envelope = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    envelope.unlink(missing_ok=True)
    done = rig.inv(*prebuild_args(path), env=NATIVE)
    assert done.returncode == 5, done.stderr
    assert "fdl: no host could be asked to verify its copy (1 not verified), so nothing was " in (
        done.stderr
    )
    assert "Compiling" not in done.stderr and not envelope.exists()
    # Asked otherwise: built and published, the host named not verified.
    done = rig.inv(*prebuild_args(path), env={**NATIVE, "INVOKE_FDL_REQUIRE_VERIFIED": "none"})
    assert done.returncode == 0, done.stderr
    assert "verify: 0 host(s) verified (same bytes, every library resolves), 1 not verified: " in (
        done.stderr
    )
    assert envelope.exists()


def test_no_verify_says_the_envelope_is_unverified(rig: RigCluster) -> None:
    path = rig.write([worker(rig, "good")], "no-verify.yaml")
    line = (
        "prebuild: envelope of ddp-bench published unverified (--no-verify or "
        "fdl.verify false): no host was asked whether it sees its binary and can load it"
    )
    done = rig.inv(*prebuild_args(path, "--no-verify"), env=NATIVE)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines().count(line) == 1, done.stderr
    done = rig.inv(*prebuild_args(path), env=NATIVE)
    assert done.returncode == 0, done.stderr
    assert "published unverified" not in done.stderr


def test_build_host_finds_a_refused_login_before_building(rig: RigCluster) -> None:
    """build-host probes its host first, as prebuild does: a refused key is preflight's
    error there (exit 4), and nothing is built."""
    key = other_key(rig)
    path = rig.write([worker(rig, "good", identity_file=str(key))], "build-host-key.yaml")
    done = rig.inv(
        "build-host",
        "--host",
        "good",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        env=NATIVE,
    )
    assert done.returncode == 4, done.stderr
    assert "error    good: authentication refused at 127.0.6.1:2222 for user root" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "fdl: preflight found errors on good; nothing was built"
    )
    assert "started" not in done.stderr


def test_a_refused_login_at_verification_publishes_nothing(rig: RigCluster) -> None:
    """A watch cycle after the first runs no preflight: a login refused at its
    verification (the host stopped accepting the key since the first cycle) fails the
    cycle with the login's words, and nothing is published."""
    path = rig.write([worker(rig, "good")], "verify-key.yaml")
    envelope = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    accepted = rig.rig.authorized_keys
    saved = accepted.read_bytes()
    run = rig.background(*prebuild_args(path, "--watch"), env=NATIVE)
    try:
        assert wait_cycle(run, 1, CYCLE_BUDGET)[0] == "ok", run.stderr
        accepted.write_text("")  # sshd reads it at each login: no key is accepted now
        set_rev(rig, "refused")
        assert wait_cycle(run, 2, CYCLE_BUDGET)[0] == "FAILED", run.stderr
    finally:
        accepted.write_bytes(saved)
        Running.stop_all()
    assert "delivery verification could not log in to 1 host(s); no envelope was " in run.stderr
    assert "good: authentication refused at 127.0.6.1:2222 for user root" in run.stderr
    assert not envelope.exists()
    set_rev(rig, "0")
