"""Copy delivery's pure part: the delivery key, what the host answered, what to send."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.publish.delivery import (
    HostState,
    Target,
    copy_hosts,
    decide,
    parse_state,
    query_script,
)
from fdl_tasks.publish.delivery_io import deliver
from fdl_tasks.publish.libtorch_push import changed, listing_script, parse_listing
from fdl_tasks.ssh.outcomes import Failure


def cluster(**top: object) -> dict[str, object]:
    return {
        "controller": {"path": "/p"},
        "workers": [
            {"host": "a", "path": "/p"},
            {"host": "b", "path": "/home/u/run", "delivery": "copy"},
            {"host": "c", "path": "/p", "delivery": "shared"},
        ],
        **top,
    }


def test_delivery_per_worker_and_cluster_default() -> None:
    loaded = parse_cluster(cluster(), "c.yaml")
    assert [w.host for w in copy_hosts(loaded, loaded.workers)] == ["b"]
    everywhere = parse_cluster(cluster(delivery="copy"), "c.yaml")
    assert [w.host for w in copy_hosts(everywhere, everywhere.workers)] == ["a", "b"]


def test_unknown_delivery_is_refused_with_its_key() -> None:
    data = cluster()
    data["workers"][1]["delivery"] = "rsync"  # type: ignore[index]
    with pytest.raises(FdlError, match=r"workers\[1\]\.delivery.*'shared'.*'copy'.*'rsync'"):
        parse_cluster(data, "c.yaml")


def test_arch_auto_on_a_copy_host_is_refused_with_the_way_out() -> None:
    """auto picks among the controller's variants; a copy host must already hold one."""
    data = cluster(delivery="copy")
    data["workers"][0]["arch"] = "auto"  # type: ignore[index]
    with pytest.raises(FdlError, match=r"workers\[0\]\.arch: 'auto'.*'a' is a copy host"):
        parse_cluster(data, "c.yaml")
    data["workers"][0]["delivery"] = "shared"  # type: ignore[index]
    assert parse_cluster(data, "c.yaml").workers[0].arch == "auto"


TARGET = Target(
    host="b",
    source=Path("/x"),
    sha256="ab" * 32,
    size=50_000_000,
    final="/home/u/run/target/cluster/b/cpu/release/ddp bench",
    workdir="/home/u/run/ddp-bench",
)


def state(**fields: object) -> HostState:
    values: dict[str, object] = {
        "mkdir": "ok",
        "writable": True,
        "sha256": None,
        "free_bytes": 10**9,
    }
    return HostState(**(values | fields))  # type: ignore[arg-type]


def test_same_bytes_send_nothing_other_bytes_send() -> None:
    assert decide(TARGET, state(sha256="ab" * 32)).action == "skip"
    assert decide(TARGET, state(sha256="cd" * 32)).action == "send"
    assert decide(TARGET, state()).action == "send"


def test_full_disk_names_host_and_bytes() -> None:
    decision = decide(TARGET, state(free_bytes=1_000_000))
    assert decision.action == "error"
    assert decision.message == (
        "b: not enough space in /home/u/run/target/cluster/b/cpu/release: the binary needs "
        "50000000 bytes (50.0 MB), 1.0 MB free"
    )


def test_unwritable_and_uncreatable_directories() -> None:
    assert decide(TARGET, state(writable=False)).message.endswith("is not writable by the ssh user")
    made = decide(
        TARGET, state(mkdir="mkdir: cannot create directory '/home/u': Permission denied")
    )
    assert made.message.startswith("b: /home/u/run/target/cluster/b/cpu/release cannot be created")


def test_query_script_in_a_real_shell(tmp_path: Path) -> None:
    """The script's answers, from sh itself, for a path with a space in it."""
    target = Target(
        host="b",
        source=Path("/x"),
        sha256="0" * 64,
        size=1,
        final=str(tmp_path / "run dir/bin/ddp bench"),
        workdir=str(tmp_path / "run dir/crate"),
    )
    stale = Path(target.part("dead"))
    out = subprocess.run(["sh", "-c", query_script(target)], capture_output=True, text=True)
    found = parse_state(out.stdout)
    assert found is not None and found.mkdir == "ok" and found.writable
    assert found.sha256 is None and found.free_bytes and found.free_bytes > 0
    assert (tmp_path / "run dir/crate").is_dir()
    stale.write_bytes(b"half")
    Path(target.final).write_bytes(b"x")
    out = subprocess.run(["sh", "-c", query_script(target)], capture_output=True, text=True)
    found = parse_state(out.stdout)
    assert found is not None
    assert found.sha256 == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    assert not stale.exists()


def test_no_markers_no_state() -> None:
    assert parse_state("a banner\n") is None


def test_variant_listing_and_what_changed(tmp_path: Path) -> None:
    """The listing from a real ``find``; a file moves when missing, resized or retimed."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/libtorch.so").write_bytes(b"12345")
    os.utime(tmp_path / "lib/libtorch.so", (1_700_000_000, 1_700_000_000.7))
    out = subprocess.run(
        ["sh", "-c", listing_script(str(tmp_path))], capture_output=True, text=True
    )
    remote = parse_listing(out.stdout)
    assert remote == {"lib/libtorch.so": (5, 1_700_000_000)}
    local = {"lib/libtorch.so": (5, 1_700_000_000), "lib/libc10.so": (3, 1)}
    assert changed(local, remote) == ["lib/libc10.so"]
    assert changed({"lib/libtorch.so": (6, 1_700_000_000)}, remote) == ["lib/libtorch.so"]
    assert changed({"lib/libtorch.so": (5, 1_700_000_001)}, remote) == ["lib/libtorch.so"]
    missing = subprocess.run(
        ["sh", "-c", listing_script(str(tmp_path / "none"))], capture_output=True, text=True
    )
    assert parse_listing(missing.stdout) == {}


class _DownFleet:
    """The Fleet's answer for a copy host whose sshd is gone (the ssh layer's Failure)."""

    def run(self, scripts: dict[str, str], timeout: float) -> dict[str, Failure]:
        return {host: Failure("connection refused") for host in scripts}


def test_a_copy_host_not_reached_is_an_error_not_a_stale_entry() -> None:
    """Its old binary would stay at the final path: publishing its entry would launch it."""
    settings = Settings()
    copies = deliver(_DownFleet(), [TARGET], settings, lambda line: None)  # type: ignore[arg-type]
    assert copies.sent == {} and copies.current == ()
    assert copies.problems == (
        "b: not reached (connection refused): the binary it holds cannot be brought up to "
        "date; bring the host back, or take it out of the cluster file",
    )
