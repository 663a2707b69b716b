"""Host keys as OpenSSH checks them, against real sshd host keys.

``StrictHostKeyChecking`` from a worker's ``ssh.options`` and from the user's
ssh_config, a global known_hosts file of the test's own (never the machine's
``/etc/ssh/ssh_known_hosts``), ``@revoked`` and ``@cert-authority`` lines.
Every run has its own user known_hosts file, so that what a run writes there
is exactly what the test sees.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from rig.harness import RigCluster, start_rig
from rig.sshrig import HostSpec

pytestmark = pytest.mark.rig

HOSTS = [
    HostSpec("strict", "127.0.0.80"),
    HostSpec("managed", "127.0.0.81"),
    HostSpec("impostor", "127.0.0.82"),
    HostSpec("revoked", "127.0.0.83"),
    HostSpec("tofu", "127.0.0.84"),
]
#: Budgets no healthy host can miss, however busy the controller: every host
#: here answers, so no verdict may hang on the machine being idle.
TIMEOUTS = {"INVOKE_FDL_CONNECT_TIMEOUT": "30", "INVOKE_FDL_PROBE_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("hostkeys"), HOSTS) as cluster:
        yield cluster


def user_file(rig: RigCluster, name: str, text: str | None = None) -> Path:
    """A user known_hosts file of this run's own: absent, or holding ``text``."""
    path = rig.root / f"{name}.known_hosts"
    path.unlink(missing_ok=True)
    if text is not None:
        path.write_text(text)
    return path


def preflight(
    rig: RigCluster, workers: list[dict[str, Any]], name: str, known_hosts: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    path = rig.write(workers, f"{name}.yaml")
    done = rig.inv(
        "preflight",
        "--json",
        "--cluster-file",
        str(path),
        env={**TIMEOUTS, "INVOKE_FDL_KNOWN_HOSTS": str(known_hosts), **env},
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done, {v["host"]: v for v in json.loads(done.stdout)} if done.stdout else {}


def with_options(rig: RigCluster, name: str, *options: str) -> dict[str, Any]:
    return rig.worker(name, ssh={**rig.rig.ssh_entry(name), "options": list(options)})


def fingerprint(rig: RigCluster, name: str) -> str:
    keytype, blob = rig.rig.host_public_key(name).split()
    return str(paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)).fingerprint)


def key_line(rig: RigCluster, as_host: str, key_of: str) -> str:
    """``as_host``'s known_hosts name with ``key_of``'s key."""
    name = rig.rig.known_hosts_line(as_host).split()[0]
    return f"{name} {rig.rig.host_public_key(key_of)}"


def test_strict_yes_refuses_an_unknown_host_and_writes_nothing(rig: RigCluster) -> None:
    known = user_file(rig, "strict")
    done, got = preflight(
        rig, [with_options(rig, "strict", "StrictHostKeyChecking=yes")], "strict", known
    )
    assert done.returncode == 1
    assert got["strict"]["status"] == "error", got["strict"]
    reason = got["strict"]["errors"][0]
    assert reason.startswith("host key of 127.0.0.80:2222 (ssh-ed25519 SHA256:"), reason
    assert fingerprint(rig, "strict") in reason and "StrictHostKeyChecking is yes" in reason
    hint = f"ssh-keyscan -p 2222 -t ssh-ed25519 127.0.0.80 >> {known}"
    assert reason.endswith(hint), reason
    assert not known.exists()
    # The hint works: after it, the host is known and strict checking passes.
    subprocess.run(["sh", "-c", hint], check=True, capture_output=True, timeout=30)
    done, got = preflight(
        rig, [with_options(rig, "strict", "StrictHostKeyChecking=yes")], "strict", known
    )
    assert done.returncode == 0 and got["strict"]["status"] == "ok", done.stderr


def test_strict_yes_from_the_users_ssh_config(rig: RigCluster) -> None:
    config = rig.root / "strict-ssh-config"
    config.write_text("Host 127.0.0.80\n    StrictHostKeyChecking ask\n")
    known = user_file(rig, "strict-config")
    done, got = preflight(
        rig,
        [rig.worker("strict"), rig.worker("tofu")],
        "strict-config",
        known,
        INVOKE_FDL_SSH_CONFIG=str(config),
    )
    assert done.returncode == 1
    assert (
        "StrictHostKeyChecking is ask (no one to ask: treated as yes)"
        in (got["strict"]["errors"][0])
    )
    assert got["tofu"]["status"] == "ok"  # the block is for 127.0.0.80 only
    assert known.read_text() == rig.rig.known_hosts_line("tofu") + "\n"


def test_the_global_file_is_trusted_and_a_mismatch_with_it_refused(rig: RigCluster) -> None:
    global_file = rig.root / "ssh_known_hosts"
    global_file.write_text(
        rig.rig.known_hosts_line("managed") + "\n" + key_line(rig, "impostor", "managed") + "\n"
    )
    known = user_file(rig, "global")
    workers = [rig.worker("managed"), rig.worker("impostor")]
    env = {"INVOKE_FDL_GLOBAL_KNOWN_HOSTS": str(global_file)}
    done, got = preflight(rig, workers, "global", known, **env)
    assert done.returncode == 1
    assert got["managed"]["status"] == "ok", got["managed"]
    assert got["impostor"]["status"] == "error"
    assert got["impostor"]["errors"][0].startswith(
        f"host key of 127.0.0.82:2222 does not match the one remembered in {global_file}: "
        "it may be a man in the middle"
    ), got["impostor"]
    assert not known.exists()  # trusted from the global file, refused: nothing to remember
    # Strict checking trusts the global file's key too.
    strict = [with_options(rig, "managed", "StrictHostKeyChecking yes")]
    done, got = preflight(rig, strict, "global-strict", known, **env)
    assert done.returncode == 0 and got["managed"]["status"] == "ok", done.stderr
    # Not pointed at it, the same run does not know the host.
    done, got = preflight(rig, strict, "global-unset", known)
    assert "is not known" in got["managed"]["errors"][0]


def test_a_revoked_key_is_refused(rig: RigCluster) -> None:
    revoked = f"@revoked * {rig.rig.host_public_key('revoked')}\n"
    known = user_file(rig, "revoked", revoked)
    done, got = preflight(rig, [rig.worker("revoked")], "revoked", known)
    assert done.returncode == 1
    reason = got["revoked"]["errors"][0]
    assert reason.startswith("host key of 127.0.0.83:2222 (ssh-ed25519 SHA256:"), reason
    assert f"is marked @revoked in {known}" in reason
    assert known.read_text() == revoked  # not remembered
    # Revoked in the user file beats a global line that trusts it.
    global_file = rig.root / "revoked-global"
    global_file.write_text(rig.rig.known_hosts_line("revoked") + "\n")
    env = {"INVOKE_FDL_GLOBAL_KNOWN_HOSTS": str(global_file)}
    done, got = preflight(rig, [rig.worker("revoked")], "revoked-global", known, **env)
    assert done.returncode == 1
    assert f"is marked @revoked in {known}" in got["revoked"]["errors"][0]


def test_a_cert_authority_line_is_named_once(rig: RigCluster) -> None:
    ca = f"@cert-authority *.example.org {rig.rig.host_public_key('strict')}\n"
    known = user_file(rig, "ca", "# managed by hand\n" + ca)
    done, got = preflight(rig, [rig.worker("tofu"), rig.worker("managed")], "ca", known)
    assert done.returncode == 0, done.stderr
    warning = f"warning: {known} line 2: @cert-authority: paramiko cannot check host certificates"
    assert done.stderr.count(warning) == 1, done.stderr
    assert done.stderr.count("@cert-authority") == 1
    assert got["tofu"]["status"] == "ok" and got["managed"]["status"] == "ok"


def test_accept_new_by_default_records_each_key_once(rig: RigCluster) -> None:
    known = user_file(rig, "tofu")
    for _ in range(2):  # the first run records, the second finds
        done, _ = preflight(rig, [rig.worker("tofu"), rig.worker("managed")], "tofu", known)
        assert done.returncode == 0, done.stderr
        assert sorted(known.read_text().splitlines()) == sorted(
            [rig.rig.known_hosts_line("managed"), rig.rig.known_hosts_line("tofu")]
        )
    assert "warning:" not in done.stderr  # (the controller's own data path may warn)


def test_strict_no_is_accept_new_with_a_warning(rig: RigCluster) -> None:
    known = user_file(rig, "no")
    done, got = preflight(rig, [with_options(rig, "tofu", "StrictHostKeyChecking=no")], "no", known)
    assert done.returncode == 0, done.stderr
    assert "warning: StrictHostKeyChecking no for tofu: treated as accept-new" in done.stderr
    assert known.read_text() == rig.rig.known_hosts_line("tofu") + "\n"
    # A changed key stays refused under "no".
    known.write_text(key_line(rig, "tofu", "strict") + "\n")
    done, got = preflight(rig, [with_options(rig, "tofu", "StrictHostKeyChecking=no")], "no", known)
    assert done.returncode == 1
    assert "does not match the one remembered in" in got["tofu"]["errors"][0]
    assert shlex.quote("[127.0.0.84]:2222") in got["tofu"]["errors"][0]
