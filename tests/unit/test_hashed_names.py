"""Hashed known_hosts names: found with a number of HMACs that does not grow with the file.

The HMACs are counted (:attr:`HashedNames.hmacs`), not timed: a lookup that
scanned the file would cost one per line, so a fleet's lookups would grow
with the fleet's size squared.
"""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from fdl_tasks.ssh.hashed_names import HashedNames
from fdl_tasks.ssh.hashed_names_io import names_file
from fdl_tasks.ssh.known_hosts import KnownHostsTable
from fdl_tasks.ssh.known_hosts_io import KnownHosts

KEY = paramiko.ECDSAKey.generate()


def host(i: int) -> str:
    return f"[10.0.{i // 250}.{i % 250}]:2300"


def hashed_file(hosts: int, others: int = 0) -> bytes:
    """One hashed line per host, as Debian's ssh writes them, then lines of other hosts."""
    names = [host(i) for i in range(hosts)] + [f"other-{i}" for i in range(others)]
    return "".join(
        f"{paramiko.HostKeys.hash_host(n)} {KEY.get_name()} {KEY.get_base64()}\n" for n in names
    ).encode()


def table(data: bytes, known: dict[str, str] | None = None) -> KnownHostsTable:
    parsed = KnownHostsTable(known)
    parsed.parse(data)
    return parsed


@pytest.mark.parametrize("hosts", [64, 512])
def test_a_remembered_file_costs_one_hmac_per_line_and_none_per_lookup(hosts: int) -> None:
    data = hashed_file(hosts)
    first = table(data)
    assert [len(first.entries(host(i))) for i in range(hosts)] == [1] * hosts
    assert first.hashed.hmacs >= hosts * hosts // 2  # a first run scans, as OpenSSH does
    again = table(data, first.hashed.resolved())
    assert again.hashed.hmacs == hosts  # each remembered name proved once, as the file is read
    found = [again.entries(host(i)) for i in range(hosts)]
    assert [e[0].number for e in found] == list(range(1, hosts + 1))
    assert again.hashed.hmacs == hosts  # and no lookup scanned the file


def test_lines_of_other_hosts_cost_one_hmac_each_per_lookup() -> None:
    """What the cache cannot prove: a name of no host in the fan-out is tried per host."""
    data = hashed_file(100, others=10)
    first = table(data)
    for i in range(100):
        first.entries(host(i))
    again = table(data, first.hashed.resolved())
    proofs = again.hashed.hmacs
    for i in range(100):
        again.entries(host(i))
    assert again.hashed.hmacs - proofs == 100 * 10


def test_a_wrong_or_stale_cache_is_never_believed() -> None:
    data = hashed_file(8)
    tokens = [line.split()[0] for line in data.decode().splitlines()]
    lies = {tokens[0]: host(1), tokens[1]: host(0), "|1|c2FsdA==|aG1hYw==": host(2)}
    lied_to = table(data, lies)
    assert [e.number for e in lied_to.entries(host(0))] == [1]
    assert [e.number for e in lied_to.entries(host(1))] == [2]
    assert lied_to.entries("[10.0.9.9]:2300") == []


def test_a_host_with_several_lines_gets_them_all() -> None:
    one = f"{paramiko.HostKeys.hash_host(host(3))} {KEY.get_name()} {KEY.get_base64()}\n"
    data = hashed_file(4) + one.encode()
    first = table(data)
    assert [e.number for e in first.entries(host(3))] == [4, 5]
    again = table(data, first.hashed.resolved())
    assert [e.number for e in again.entries(host(3))] == [4, 5]


def test_a_malformed_hashed_name_names_no_host() -> None:
    names = HashedNames()
    assert names.add("|1|not base64!|x") is False
    assert names.add("|2|c2FsdA==|aG1hYw==") is False


def test_the_names_found_are_remembered_in_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "known_hosts"
    path.write_bytes(hashed_file(32))
    first = KnownHosts(path)
    for i in range(32):
        first.entries(host(i))
    first.remember_names()
    assert names_file(path).is_file()
    again = KnownHosts(path)
    assert again.hashed.hmacs == 32
    assert all(again.entries(host(i)) for i in range(32))
    assert again.hashed.hmacs == 32
    names_file(path).write_text("{not json")
    damaged = KnownHosts(path)  # a damaged cache costs the scan, nothing else
    assert [len(damaged.entries(host(i))) for i in range(32)] == [1] * 32
