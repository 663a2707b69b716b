"""ssh failures sorted into kinds, said with their fix, and what they come to.

paramiko's and the socket module's own exception types (raised as paramiko raises
them: a banner error chained to what ended the read) go in; a kind, a reason with
a quoted line to try by hand, a verdict and an exit code come out.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import threading
from pathlib import Path

import fabric
import paramiko
import pytest
from invoke.context import Context
from invoke.exceptions import CommandTimedOut, Exit
from invoke.runners import Result

from fdl_tasks.cli import user_errors
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError, LoginRefused, NothingVerified
from fdl_tasks.preflight.login_verdicts import (
    check_verified,
    failed_verdict,
    is_error,
    nothing_reached,
    preflight_error,
)
from fdl_tasks.preflight.probe import HostVerdict
from fdl_tasks.ssh.hostkey_policy import HostKeyRefused, added_lines
from fdl_tasks.ssh.login_facts import greet, load_identity, login_of
from fdl_tasks.ssh.outcomes import Failure, FailureKind
from fdl_tasks.ssh.ssh_failures import Login, classify, describe_failure, key_file_failure

LOGIN = Login("root", "10.0.0.5", 2222, ("/keys/id",), identity_only=True)


def banner_error(ended: BaseException) -> paramiko.SSHException:
    """paramiko's banner error, chained to what ended its read, as paramiko raises it."""
    try:
        try:
            raise ended
        except BaseException as exc:
            raise paramiko.SSHException("Error reading SSH protocol banner" + str(exc)) from None
    except paramiko.SSHException as chained:
        chained.__context__ = ended
        return chained


KEY = paramiko.ECDSAKey.generate()
CASES = [
    (HostKeyRefused("refused"), "", FailureKind.HOST_KEY),
    (
        paramiko.BadHostKeyException("h", KEY, paramiko.ECDSAKey.generate()),
        "",
        FailureKind.HOST_KEY,
    ),
    (paramiko.PasswordRequiredException("private key file is encrypted"), "", FailureKind.KEY_FILE),
    (paramiko.AuthenticationException("Authentication failed."), "", FailureKind.AUTH),
    (paramiko.BadAuthenticationType("Bad authentication type", ["password"]), "", FailureKind.AUTH),
    (paramiko.SSHException("No authentication methods available"), "", FailureKind.AUTH),
    (
        paramiko.ssh_exception.NoValidConnectionsError({("h", 22): OSError()}),
        "",
        FailureKind.UNREACHABLE,
    ),
    (ConnectionRefusedError(111, "Connection refused"), "", FailureKind.UNREACHABLE),
    (TimeoutError(), "", FailureKind.UNREACHABLE),
    (socket.gaierror(-2, "Name or service not known"), "", FailureKind.UNREACHABLE),
    (CommandTimedOut(Result(), 5), "", FailureKind.UNREACHABLE),
    (banner_error(TimeoutError()), "", FailureKind.UNREACHABLE),  # accepted, silent: hung
    (banner_error(EOFError()), "", FailureKind.UNREACHABLE),  # closed, says nothing when greeted
    (banner_error(EOFError()), "SSH-2.0-OpenSSH_9.2", FailureKind.UNREACHABLE),  # a busy sshd
    (banner_error(EOFError()), "HTTP/1.1 400 Bad Request", FailureKind.NOT_SSH),
    (banner_error(ConnectionResetError()), "220 smtp ESMTP", FailureKind.NOT_SSH),
    (paramiko.SSHException("Expecting packet from (31,), got 30"), "", FailureKind.NOT_SSH),
    (paramiko.SSHException('Indecipherable protocol version "x"'), "", FailureKind.NOT_SSH),
    (
        paramiko.ssh_exception.IncompatiblePeer("Incompatible version (1.5 instead of 2.0)"),
        "",
        FailureKind.NOT_SSH,
    ),
    (
        paramiko.ssh_exception.IncompatiblePeer("Incompatible ssh peer (no acceptable kex)"),
        "",
        FailureKind.OTHER,
    ),
    (ValueError("odd"), "", FailureKind.OTHER),
]


@pytest.mark.parametrize(("exc", "answer", "kind"), CASES)
def test_each_exception_type_has_its_kind(
    exc: BaseException, answer: str, kind: FailureKind
) -> None:
    assert classify(exc, answer) is kind
    assert describe_failure(exc, Login("u", "h", 22, answer=answer), 5).kind is kind


def test_a_refused_key_names_user_keys_and_a_quoted_line_to_try() -> None:
    login = Login("o'neil", "10.0.0.5", 2222, ("/my keys/id", "/root/.ssh/id_rsa"), agent=True)
    failure = describe_failure(paramiko.AuthenticationException("no"), login, 5)
    problem, line = failure.reason.split("; try by hand: ")
    assert problem == (
        "authentication refused at 10.0.0.5:2222 for user o'neil (keys offered: /my keys/id, "
        "/root/.ssh/id_rsa, the ssh agent's keys): check the user, and that the key's public "
        "half is in ~o'neil/.ssh/authorized_keys there"
    )
    assert shlex.split(line) == [
        "ssh",
        "-i",
        "/my keys/id",
        "-p",
        "2222",
        "o'neil@10.0.0.5",
        "true",
    ]
    assert line == "ssh -i '/my keys/id' -p 2222 'o'\"'\"'neil@10.0.0.5' true"


def test_no_key_to_offer_says_so() -> None:
    failure = describe_failure(
        paramiko.SSHException("No authentication methods available"), Login("u", "h", 22), 5
    )
    assert failure.reason == (
        "no key to log in to h:22 as u: no ssh.identity_file, no ssh agent and no ~/.ssh/id_* "
        "key; set ssh.identity_file; try by hand: ssh -p 22 u@h true"
    )


def test_other_configuration_failures_say_what_they_are() -> None:
    only_password = paramiko.BadAuthenticationType("Bad authentication type", ["password"])
    assert describe_failure(only_password, LOGIN, 5).reason.startswith(
        "10.0.0.5:2222 does not accept keys for user root (it allows: password)"
    )
    passphrase = paramiko.PasswordRequiredException("encrypted")
    assert describe_failure(passphrase, LOGIN, 5).reason.startswith(
        "/keys/id needs a passphrase and no ssh agent holds it: ssh-add it"
    )
    web = Login("root", "10.0.0.5", 2222, answer="HTTP/1.1 400 Bad Request")
    assert describe_failure(banner_error(EOFError()), web, 5).reason.startswith(
        "10.0.0.5:2222 answers, but not as an SSH server (it said 'HTTP/1.1 400 Bad Request'): "
        "check that 2222 is its sshd's port"
    )
    # As the Fleet builds it for an unusable file: the key is not loaded, so not "only".
    public = key_file_failure(Login("root", "h", 22, ("/k/id.pub", "/r/.ssh/id_rsa")), "public")
    assert public.kind is FailureKind.KEY_FILE
    assert public.reason.endswith(
        "try by hand: ssh -i /k/id -o IdentitiesOnly=yes -p 22 root@h true"
    )
    assert public.reason.startswith("ssh.identity_file /k/id.pub is a public key: point it at ")
    missing = key_file_failure(Login("root", "h", 22, ("/k/gone",)), "missing")
    assert missing.reason == (
        "ssh.identity_file /k/gone does not exist (to log in to h:22 as root); try by hand: "
        "ssh -i /k/gone -o IdentitiesOnly=yes -p 22 root@h true"
    )


def test_hosts_down_keep_their_words() -> None:
    down = Login("u", "10.0.0.9", 22)
    assert describe_failure(ConnectionRefusedError(), down, 5).reason == (
        "connection refused at 10.0.0.9:22"
    )
    assert describe_failure(TimeoutError(), down, 2).reason == (
        "connection to 10.0.0.9:22 timed out after 2s"
    )
    assert (
        "no SSH banner: hung host?"
        in describe_failure(banner_error(TimeoutError()), down, 2).reason
    )
    assert (
        "closed it before any SSH banner"
        in describe_failure(banner_error(EOFError()), down, 2).reason
    )


def test_what_a_failure_comes_to() -> None:
    auth = Failure("authentication refused at h:22 ...", FailureKind.AUTH)
    error = failed_verdict("a", "/data", auth, "error")
    assert (error.status, error.errors, error.failure) == ("error", (auth.reason,), "auth")
    warned = failed_verdict("a", "/data", auth, "warn")
    assert warned.status == "warning" and warned.failure == "auth"
    assert warned.warnings == (f"{auth.reason} (a warning: fdl.ssh_login_errors is warn)",)
    down = failed_verdict("b", "/data", Failure("connection refused at h:22"), "error")
    assert down.status == "warning" and down.warnings == (
        "unreachable: connection refused at h:22",
    )
    assert down.to_json()["failure"] == "unreachable"
    assert is_error(FailureKind.HOST_KEY, "warn") and not is_error(FailureKind.NOT_SSH, "warn")
    assert not is_error(FailureKind.UNREACHABLE, "error") and is_error(
        FailureKind.KEY_FILE, "error"
    )
    assert preflight_error([error, down]) is LoginRefused
    data = HostVerdict("c", "error", ("declared data_path /d is missing",))
    assert preflight_error([data]) is FdlError
    refused_key = failed_verdict(
        "d", "/data", Failure("host key of ...", FailureKind.HOST_KEY), "warn"
    )
    assert preflight_error([refused_key]) is FdlError


def test_what_verification_must_reach() -> None:
    down = {"a": "unreachable: connection refused at a:22"}
    for requirement in ("one", "all"):
        with pytest.raises(NothingVerified, match=r"no host could be asked .*: a \(unreachable"):
            check_verified(0, down, requirement)
    check_verified(0, down, "none")
    check_verified(1, down, "one")
    with pytest.raises(FdlError, match=r"fdl\.require_verified is on") as raised:
        check_verified(1, down, "all")
    assert not isinstance(raised.value, NothingVerified)
    check_verified(0, {}, "one")  # no host to ask: nothing to fail
    with pytest.raises(NothingVerified, match="so nothing was built"):
        check_verified(0, down, "one", published=False)
    failed = [HostVerdict("a", "warning", failure="unreachable"), HostVerdict("b", "ok")]
    assert not nothing_reached(failed, ["a", "b"])
    assert nothing_reached(failed, ["a"]) and not nothing_reached([], [])


def test_the_settings_and_their_words() -> None:
    def get(**fdl: object) -> Settings:
        return Settings.from_config(fdl)

    assert get().require_verified == "one" and get().ssh_login_errors == "error"
    assert get(require_verified=True).require_verified == "all"
    assert get(require_verified="0").require_verified == "none"
    assert get(require_verified="NONE").require_verified == "none"
    assert get(ssh_login_errors="Warn").ssh_login_errors == "warn"
    with pytest.raises(FdlError, match=r"fdl.require_verified must be all, one or none"):
        get(require_verified="most")
    with pytest.raises(FdlError, match=r"fdl.ssh_login_errors must be error or warn, got 'no'"):
        get(ssh_login_errors="no")


def test_exit_codes() -> None:
    def raising(error: Exception) -> int:
        def body(c: Context) -> None:
            raise error

        with pytest.raises(Exit) as ended:
            user_errors(body)(Context())
        return int(ended.value.code)

    assert raising(LoginRefused("x")) == 4
    assert raising(NothingVerified("x")) == 5
    assert raising(FdlError("x")) == 1


def test_accept_new_is_said_in_one_line_per_file() -> None:
    added = [
        ("[10.0.0.1]:2222", "ssh-ed25519", Path("/k")),
        ("10.0.0.2", "ecdsa-sha2-nistp256", Path("/k")),
        ("10.0.0.3", "ssh-rsa", None),
    ]
    assert added_lines(added) == [
        "permanently added '[10.0.0.1]:2222' (ED25519), '10.0.0.2' (ECDSA) to the "
        "list of known hosts (/k; StrictHostKeyChecking accept-new)",
        "permanently added '10.0.0.3' (RSA) to the list of known hosts (in memory: "
        "no user known_hosts file; StrictHostKeyChecking accept-new)",
    ]
    assert added_lines([]) == []


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def test_identity_files_as_read(tmp_path: Path) -> None:
    key = keygen(tmp_path / "id")
    assert load_identity(str(key)).pkey is not None
    public = load_identity(f"{key}.pub")
    assert public.unusable and public.why == "public" and public.pkey is None
    (tmp_path / "notes").write_text("hello\n")
    assert load_identity(str(tmp_path / "notes")).why == "unreadable"
    assert load_identity(str(tmp_path / "absent")).why == "missing"
    locked = load_identity(str(keygen(tmp_path / "locked", "secret")))
    assert not locked.unusable and locked.pkey is None  # paramiko (or the agent) then


def test_the_keys_a_connection_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    default = keygen(tmp_path / ".ssh/id_ed25519")
    only = fabric.Connection(
        "h", user="u", port=2200, connect_kwargs={"key_filename": ["/k/id"], "look_for_keys": False}
    )
    assert login_of(only, {"SSH_AUTH_SOCK": "/agent"}) == Login(
        "u", "h", 2200, ("/k/id",), agent=True, identity_only=True
    )
    anything = fabric.Connection("h", user="u", port=22)
    assert login_of(anything, {}) == Login("u", "h", 22, (str(default),))
    first = fabric.Connection("jump1", user="j", port=22)
    second = fabric.Connection("jump2", user="k", port=2022, gateway=first)
    hopped = login_of(fabric.Connection("h", user="u", port=22, gateway=second), {})
    assert shlex.split(hopped.by_hand())[-6:] == [
        "-J", "j@jump1:22,k@jump2:2022", "-p", "22", "u@h", "true"
    ]  # fmt: skip
    proxied = login_of(fabric.Connection("h", user="u", gateway="nc -x p:1080 %h %p"), {})
    assert shlex.split(proxied.by_hand())[-6:-4] == ["-o", "ProxyCommand=nc -x p:1080 %h %p"]


def test_greeting_a_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nServer: x\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        assert greet("127.0.0.1", port, 5) == "HTTP/1.1 400 Bad Request"
    assert greet("127.0.0.1", port, 1) == ""  # nothing listens any more
