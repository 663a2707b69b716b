"""Host keys: :class:`KnownHosts`, :class:`KnownHostsView` and :class:`TrustOnFirstUse`.

Handshakes are real: paramiko's own SSH server on one end of a socket pair,
paramiko's client, given the view and the policy as the fleet gives them, on
the other. What the client decides (connect, or which error) and what ends up
in the known_hosts files is what is checked.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from paramiko.common import AUTH_SUCCESSFUL

from fdl_tasks.config.model import SshSettings, Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import collect
from fdl_tasks.ssh.hostkey_policy import HostKeyRefused
from fdl_tasks.ssh.known_hosts import KnownLine
from fdl_tasks.ssh.known_hosts_io import (
    KnownHosts,
    KnownHostsView,
    TrustOnFirstUse,
    explain_refusal,
    skipped_warnings,
)
from fdl_tasks.ssh.remote import Fleet
from fdl_tasks.ssh.sshconfig import host_key_options, ssh_config_block
from fdl_tasks.ssh.transports import AckingSocket, prompt_transport

NAME = "[node-a]:2222"  # how known_hosts names host node-a at port 2222


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        return AUTH_SUCCESSFUL


@pytest.fixture(scope="module")
def keys() -> list[paramiko.ECDSAKey]:
    """Host keys for the handshakes (ECDSA: paramiko generates those quickly)."""
    return [paramiko.ECDSAKey.generate() for _ in range(3)]


def line(name: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{name} {key.get_name()} {key.get_base64()}\n"


def handshake(
    view: KnownHostsView,
    policy: TrustOnFirstUse,
    server_key: paramiko.PKey,
    host: str = "node-a",
    port: int = 2222,
) -> None:
    """Connect to a server presenting ``server_key`` as ``host:port``; raises what paramiko does."""
    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(server_key)
    server.start_server(threading.Event(), _Server())
    client = paramiko.SSHClient()
    client._system_host_keys = KnownHosts()  # type: ignore[attr-defined]
    client._host_keys = view  # type: ignore[attr-defined]
    client.set_missing_host_key_policy(policy)
    try:
        client.connect(
            host,
            port,
            username="me",
            password="pw",
            sock=ours,
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
            banner_timeout=10,
            auth_timeout=10,
        )
        assert client.get_transport() is not None and client.get_transport().is_authenticated()  # type: ignore[union-attr]
    finally:
        client.close()
        server.close()
        ours.close()
        theirs.close()


def files(tmp_path: Path, user: str | None = None, global_: str | None = None) -> KnownHostsView:
    """A view of a user file and a global file under ``tmp_path`` (absent if ``None``)."""
    for name, text in (("known_hosts", user), ("ssh_known_hosts", global_)):
        if text is not None:
            (tmp_path / name).write_text(text)
    return KnownHostsView(
        [KnownHosts(tmp_path / "known_hosts")], [KnownHosts(tmp_path / "ssh_known_hosts")]
    )


def user_text(tmp_path: Path) -> str | None:
    path = tmp_path / "known_hosts"
    return path.read_text() if path.exists() else None


# ---------------------------------------------------------------------------- KnownHosts


def test_a_known_key_connects_and_nothing_is_written(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    before = "# mine\n" + line(NAME, keys[0])
    view = files(tmp_path, before)
    handshake(view, TrustOnFirstUse(view), keys[0])
    assert user_text(tmp_path) == before
    handshake(view, TrustOnFirstUse(view, "yes"), keys[0])


def test_a_changed_key_is_refused_in_every_mode_naming_the_file(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    before = line(NAME, keys[1])
    view = files(tmp_path, before)
    for strict in ("accept-new", "yes"):
        with pytest.raises(paramiko.BadHostKeyException) as caught:
            handshake(view, TrustOnFirstUse(view, strict), keys[0])
        assert caught.value.key == keys[0] and caught.value.expected_key == keys[1]
        reason = explain_refusal(caught.value, NAME, view).reason
        assert reason == (
            f"host key of node-a:2222 does not match the one remembered in "
            f"{tmp_path / 'known_hosts'}: it may be a man in the middle; if the host was "
            f"reinstalled, remove the old key with ssh-keygen -R '{NAME}' -f "
            f"{tmp_path / 'known_hosts'}"
        )
    assert user_text(tmp_path) == before


def test_a_hashed_name_is_found(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    before = line(paramiko.HostKeys.hash_host(NAME), keys[0])
    view = files(tmp_path, before)
    assert view.lookup(NAME) == {keys[0].get_name(): keys[0]}
    assert view.lookup("[node-b]:2222") is None and view.lookup("node-a") is None
    handshake(view, TrustOnFirstUse(view, "yes"), keys[0])
    with pytest.raises(paramiko.BadHostKeyException):
        handshake(view, TrustOnFirstUse(view), keys[1])
    assert user_text(tmp_path) == before


def test_a_port_entry_is_for_that_port_only(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    before = line(NAME, keys[0]) + line("node-a", keys[1])
    view = files(tmp_path, before)
    assert view.lookup(NAME) == {keys[0].get_name(): keys[0]}
    assert view.lookup("node-a") == {keys[1].get_name(): keys[1]}
    assert view.lookup("[node-a]:2223") is None
    handshake(view, TrustOnFirstUse(view, "yes"), keys[0], port=2222)
    handshake(view, TrustOnFirstUse(view, "yes"), keys[1], port=22)
    with pytest.raises(HostKeyRefused, match=r"node-a:2223 .* is not known"):
        handshake(view, TrustOnFirstUse(view, "yes"), keys[0], port=2223)
    assert user_text(tmp_path) == before


def test_duplicate_lines_are_one_key(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    before = line(NAME, keys[0]) * 2 + line(f"{NAME},node-a", keys[0])
    view = files(tmp_path, before)
    assert len(view.user[0].entries(NAME)) == 3
    assert view.lookup(NAME) == {keys[0].get_name(): keys[0]}
    handshake(view, TrustOnFirstUse(view), keys[0])
    assert view.user[0].record(NAME, keys[0]) is None  # already there: nothing written
    assert view.user[0].record(NAME, keys[1]) == keys[0]  # another key: refused
    assert user_text(tmp_path) == before


class SlowKnownHosts(KnownHosts):
    """A table slow to answer, so that threads racing on it overlap for sure."""

    def entries(self, hostname: str) -> list[KnownLine]:
        time.sleep(0.005)
        return super().entries(hostname)


def test_two_threads_recording_at_once_lose_and_repeat_nothing(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    """Hosts recorded from 16 threads at once, two of them the same host, through two
    tables of the same file (two runs at once): one line per host, in either table."""
    path = tmp_path / "known_hosts"
    tables = [SlowKnownHosts(path), SlowKnownHosts(path)]
    names = [f"[node-{i}]:2222" for i in range(15)] + ["[node-0]:2222"]
    start = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def record(i: int) -> None:
        view = KnownHostsView([tables[i % 2]])
        start.wait()
        try:
            TrustOnFirstUse(view).missing_host_key(paramiko.SSHClient(), names[i], keys[0])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(len(names))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    written = path.read_text().splitlines()
    assert sorted(written) == sorted(line(n, keys[0]).strip() for n in set(names))
    # What the other run wrote meanwhile, each table has read before writing.
    assert all(t.lookup("[node-0]:2222") is not None for t in tables)
    again = KnownHosts(path)
    assert all(again.lookup(n) == {keys[0].get_name(): keys[0]} for n in names)


def test_a_key_another_run_recorded_meanwhile_is_not_replaced(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("# no newline at the end")
    ours, theirs = KnownHosts(path), KnownHosts(path)
    assert theirs.record(NAME, keys[1]) is None
    assert ours.record(NAME, keys[0]) == keys[1]  # read theirs first: a changed key
    view = KnownHostsView([ours])
    with pytest.raises(paramiko.BadHostKeyException):
        TrustOnFirstUse(view).missing_host_key(paramiko.SSHClient(), NAME, keys[0])
    assert path.read_text() == "# no newline at the end\n" + line(NAME, keys[1])


def test_a_record_waits_for_another_run_holding_the_file(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    """The append takes the file's lock (``FileLock``, the one flock helper): while
    another process holds it, nothing is written; once it lets go, the key is."""
    path = tmp_path / "known_hosts"
    path.write_text("")
    hold = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'ab'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); sys.stdin.readline()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline().strip() == b"held"
    table = KnownHosts(path)
    recording = threading.Thread(target=table.record, args=(NAME, keys[0]))
    recording.start()
    recording.join(0.3)
    assert recording.is_alive() and path.read_text() == ""
    holder.stdin.write(b"\n")
    holder.stdin.flush()
    holder.wait()
    recording.join(10)
    assert not recording.is_alive()
    assert path.read_text() == line(NAME, keys[0])


# ---------------------------------------------------------------------------- policies


def test_strict_yes_refuses_an_unknown_host_naming_how_to_add_it(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    view = files(tmp_path)
    with pytest.raises(HostKeyRefused) as caught:
        handshake(view, TrustOnFirstUse(view, "yes", said="yes"), keys[0])
    assert caught.value.reason == (
        f"host key of node-a:2222 ({keys[0].get_name()} {keys[0].fingerprint}) is not known "
        "and StrictHostKeyChecking is yes: check that fingerprint with the host's "
        "administrator, then add the key, e.g. ssh-keyscan -p 2222 -t "
        f"{keys[0].get_name()} node-a >> {tmp_path / 'known_hosts'}"
    )
    with pytest.raises(HostKeyRefused, match="is ask \\(no one to ask: treated as yes\\)"):
        handshake(view, TrustOnFirstUse(view, "yes", said="ask"), keys[0], port=22)
    assert user_text(tmp_path) is None


def test_accept_new_records_an_unknown_host_once(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    view = files(tmp_path)
    for _ in range(2):
        handshake(view, TrustOnFirstUse(view), keys[0])
    assert user_text(tmp_path) == line(NAME, keys[0])
    assert KnownHosts(tmp_path / "known_hosts").lookup(NAME) == {keys[0].get_name(): keys[0]}


def test_hash_known_hosts_writes_a_hashed_name(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    view = files(tmp_path)
    handshake(view, TrustOnFirstUse(view, hashed=True), keys[0])
    text = user_text(tmp_path) or ""
    assert text.startswith("|1|") and "node-a" not in text
    assert KnownHosts(tmp_path / "known_hosts").lookup(NAME) == {keys[0].get_name(): keys[0]}


def test_the_global_file_is_trusted_and_a_mismatch_with_it_refused(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    view = files(tmp_path, global_=line("*.example.org,!bad.example.org", keys[0]))
    handshake(view, TrustOnFirstUse(view, "yes"), keys[0], host="good.example.org", port=22)
    with pytest.raises(paramiko.BadHostKeyException) as caught:
        handshake(view, TrustOnFirstUse(view), keys[1], host="node.example.org", port=22)
    reason = explain_refusal(caught.value, "node.example.org", view).reason
    assert reason.startswith(
        f"host key of node.example.org:22 does not match the one remembered in "
        f"{tmp_path / 'ssh_known_hosts'}: it may be a man in the middle; if the host was "
        f"reinstalled, whoever manages {tmp_path / 'ssh_known_hosts'} must update it"
    )
    with pytest.raises(HostKeyRefused, match="is not known"):  # negated: not covered
        handshake(view, TrustOnFirstUse(view, "yes"), keys[0], host="bad.example.org", port=22)
    assert user_text(tmp_path) is None


def test_a_revoked_key_is_refused_even_where_another_file_trusts_it(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    user = line("*", keys[0], "@revoked")
    view = files(tmp_path, user, global_=line(NAME, keys[0]))
    assert view.lookup(NAME) is None
    with pytest.raises(HostKeyRefused) as caught:
        handshake(view, TrustOnFirstUse(view), keys[0])
    assert caught.value.reason == (
        f"host key of node-a:2222 ({keys[0].get_name()} {keys[0].fingerprint}) is marked "
        f"@revoked in {tmp_path / 'known_hosts'}: refused"
    )
    handshake(view, TrustOnFirstUse(view), keys[1])  # another key: new, so accepted
    assert user_text(tmp_path) == user + line(NAME, keys[1])


def test_a_revoked_key_presented_instead_of_a_known_one(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    view = files(tmp_path, line(NAME, keys[1]) + line(NAME, keys[0], "@revoked"))
    with pytest.raises(paramiko.BadHostKeyException) as caught:
        handshake(view, TrustOnFirstUse(view), keys[0])
    assert "is marked @revoked in" in explain_refusal(caught.value, NAME, view).reason


def test_lines_paramiko_cannot_use_are_named_once(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    text = (
        line("*.example.org", keys[0], "@cert-authority")
        + line(NAME, keys[0])
        + "node-b ssh-unknown AAAA\n"
        + line("*.example.com", keys[1], "@cert-authority")
    )
    view = files(tmp_path, text)
    handshake(view, TrustOnFirstUse(view, "yes"), keys[0])
    path = tmp_path / "known_hosts"
    assert skipped_warnings(view.files) == [
        f"warning: {path} lines 1, 4: @cert-authority: paramiko cannot check host "
        "certificates; ignored, so a host only such a line vouches for counts as unknown",
        f"warning: {path} line 3: key type ssh-unknown is not supported by paramiko; "
        "ignored, so a host only such a line vouches for counts as unknown",
    ]


# ---------------------------------------------------------------------------- options


def lookup(block: str, host: str = "node-a") -> dict[str, object]:
    return dict(paramiko.SSHConfig.from_text(block).lookup(host))


def test_host_key_options_come_from_ssh_config_first_value_winning() -> None:
    worker = Worker(
        "a", "/p", ssh=SshSettings(options=("StrictHostKeyChecking=yes", "HashKnownHosts yes"))
    )
    block, ignored = ssh_config_block(worker)
    assert ignored == []
    user = "Host node-*\n  StrictHostKeyChecking no\n  UserKnownHostsFile ~/kh-%h-%p /x\n"
    config = lookup(block + user)
    tokens = {"h": "node-a", "p": "2222", "r": "me", "n": "a"}
    options = host_key_options("a", config, tokens, "~/.ssh/known_hosts", "/etc/g1 /etc/g2")
    home = str(Path("~").expanduser())
    assert options.strict == "yes" and options.said == "yes" and options.hashed
    assert options.user_files == (f"{home}/kh-node-a-2222", "/x")
    assert options.global_files == ("/etc/g1", "/etc/g2")
    unset = host_key_options("a", {}, tokens, "~/.ssh/known_hosts", "")
    assert unset.strict == "accept-new" and unset.said == "" and not unset.hashed
    assert unset.user_files == (f"{home}/.ssh/known_hosts",) and unset.global_files == ()
    off = host_key_options("a", lookup(user), tokens, "k", "g")
    assert off.strict == "accept-new" and off.said == "no"
    none = host_key_options("a", lookup("UserKnownHostsFile none\n"), tokens, "k", "g")
    assert none.user_files == ()


def test_bad_host_key_options_are_clear_errors() -> None:
    with pytest.raises(FdlError, match="a: StrictHostKeyChecking 'maybe' is not one of"):
        host_key_options("a", {"stricthostkeychecking": "maybe"}, {}, "k", "")
    with pytest.raises(FdlError, match="%C is not supported"):
        host_key_options("a", {"userknownhostsfile": "~/k-%C"}, {}, "k", "")


def test_an_unreadable_file_is_named_and_counts_as_empty(
    tmp_path: Path, keys: list[paramiko.PKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ssh_known_hosts"
    path.write_text(line(NAME, keys[0]))

    def refuse(self: KnownHosts, filename: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(KnownHosts, "load", refuse)
    known = KnownHosts(path)
    assert known.lookup(NAME) is None
    assert skipped_warnings([known]) == [
        f"warning: {path} cannot be read (Permission denied); ignored"
    ]


# ---------------------------------------------------------------------------- the fleet


def test_the_fleet_gives_each_host_its_policy_and_budget_and_parses_each_file_once(
    tmp_path: Path, keys: list[paramiko.PKey]
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(line("*.example.org", keys[0], "@cert-authority") + line(NAME, keys[0]))

    def worker(label: str, *options: str) -> Worker:
        return Worker(label, "/p", ssh=SshSettings(target=label, port=2222, options=options))

    workers = [
        worker("a", "StrictHostKeyChecking=yes", "ConnectTimeout=3"),
        worker("b", "StrictHostKeyChecking=off"),
        worker("c"),
        worker("d", "StrictHostKeyChecking no", "ProxyJump=c:2222"),
    ]
    settings = Settings.from_config(
        {
            "known_hosts": str(known),
            "global_known_hosts": str(tmp_path / "ssh_known_hosts"),
            "ssh_config": "",
            "system_ssh_config": "",
            "connect_timeout": 7,
        }
    )
    reports: list[str] = []
    with Fleet(workers, settings, collect(reports)) as fleet:
        clients = {label: c.client for label, c in fleet.connections.items()}
        policies = {label: client._policy for label, client in clients.items()}
        assert {label: p.strict for label, p in policies.items()} == dict(
            a="yes", b="accept-new", c="accept-new", d="accept-new"
        )
        assert fleet.connections["a"].connect_timeout == 3
        assert fleet.connections["a"].connect_kwargs["banner_timeout"] == 3
        assert fleet.connections["c"].connect_kwargs["auth_timeout"] == 7
        assert fleet.connections["c"].connect_kwargs["transport_factory"] is prompt_transport
        jump = fleet.connections["d"].gateway
        assert jump.host == "c" and jump.connect_timeout == 7
        assert jump.client._policy.strict == "accept-new"
        # One table per file, shared by every host and hop that reads it.
        tables = {id(t) for c in [*clients.values(), jump.client] for t in c._host_keys.user}
        assert len(tables) == 1
    assert reports == [
        f"warning: {known} line 1: @cert-authority: paramiko cannot check host certificates; "
        "ignored, so a host only such a line vouches for counts as unknown",
        "warning: StrictHostKeyChecking no for b, d: treated as accept-new, so a new host key "
        "is accepted unverified and remembered, but a changed one is still refused (it may "
        "be a man in the middle)",
    ]


def test_a_login_over_tcp_has_nagles_algorithm_off() -> None:
    """paramiko leaves Nagle's algorithm on, so each login and command waits on the
    host's delayed acknowledgement (40 ms a time on the rig); the Fleet's transports
    turn it off on a TCP socket and leave anything else (a jump host's channel) as is."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sock = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        transport = prompt_transport(sock)
        assert isinstance(transport.sock, socket.socket)
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        transport.close()
        peer.close()
    ours, theirs = socket.socketpair()  # no TCP: no option to set, and no error
    prompt_transport(ours).close()
    theirs.close()


def test_a_login_over_tcp_acknowledges_what_it_reads_at_once() -> None:
    """sshd sends a small message behind another and holds it until the first is
    acknowledged; a request and its reply put Linux in delayed-acknowledgement mode,
    which a fresh login's first command waited out (40 ms). Each read on the Fleet's
    transport socket leaves it in quick-acknowledgement mode; a plain socket's does not."""

    def quick(sock: socket.socket) -> int:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)

    def exchange(ours: socket.socket, peer: socket.socket) -> bytes:
        for _ in range(4):  # request, reply: delayed-acknowledgement ("pingpong") mode
            peer.sendall(b"request")
            ours.recv(64)
            ours.sendall(b"reply")
            peer.recv(64)
        peer.sendall(b"more")
        return ours.recv(64)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        plain = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        assert exchange(plain, peer) == b"more" and quick(plain) == 0
        plain.close()
        peer.close()

        sock = socket.create_connection(listener.getsockname(), timeout=7)
        peer, _ = listener.accept()
        transport = prompt_transport(sock)
        ours = transport.sock
        assert isinstance(ours, AckingSocket) and ours.gettimeout() is not None
        assert exchange(ours, peer) == b"more" and quick(ours) == 1
        transport.close()
        peer.close()
