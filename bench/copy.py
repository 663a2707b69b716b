"""Copy delivery to N hosts: fdl-tasks' SFTP uploads against scp in sequence and N rsyncs.

Brings up :class:`rig.fleetrig.FleetRig` (one real sshd per 16 loopback addresses,
127.0.5.x) and sends one random file of ``--mb`` MB (a libtorch-linked binary's
size) to a private directory per host, three ways, side by side in one run:
:func:`fdl_tasks.publish.delivery_io.deliver` over one :class:`~fdl_tasks.ssh.remote.Fleet`
(connections opened first, as prebuild holds them), one ``scp`` per host in
sequence, and ``N`` ``rsync -e ssh`` at once. A second ``deliver`` shows what
"only what is missing" costs: one query round trip, 0 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.config.model import SshSettings, Worker
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.reporting import collect
from fdl_tasks.publish.delivery import Target
from fdl_tasks.publish.delivery_io import deliver
from fdl_tasks.ssh.remote import Fleet
from rig.fleetrig import FleetRig

STATE = Path("/tmp/fdl-bench-copy")
RESULTS = Path(__file__).with_name("copy-results.json")


def ssh_options(fleet: FleetRig) -> list[str]:
    return [
        "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
        "-o", f"UserKnownHostsFile={fleet.state / 'known_hosts.openssh'}",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        "-i", str(fleet.client_key),
    ]  # fmt: skip


def dest(index: int, method: str) -> Path:
    return STATE / "hosts" / f"{index:04d}" / method / "ddp-bench"


def clean(count: int) -> None:
    shutil.rmtree(STATE / "hosts", ignore_errors=True)
    for i in range(count):
        for method in ("fdl", "scp", "rsync"):
            dest(i, method).parent.mkdir(parents=True)


def clean_fdl(count: int) -> None:
    for i in range(count):
        dest(i, "fdl").unlink(missing_ok=True)


def run_fdl(fleet: FleetRig, source: Path, sha: str, count: int, window: int) -> dict[str, float]:
    workers = [
        Worker(
            host=f"node-{i:04d}",
            path="/",
            ssh=SshSettings(
                target=fleet.address(i),
                port=fleet.port,
                user="root",
                identity_file=str(fleet.client_key),
            ),
        )
        for i in range(count)
    ]
    settings = Settings(
        known_hosts=str(fleet.state / "known_hosts.fdl"),
        global_known_hosts="/dev/null",
        ssh_config="/dev/null",
        system_ssh_config="/dev/null",
        copy_window=window,
        connect_timeout=30,
    )
    size = source.stat().st_size
    targets = [
        Target(
            host=w.host,
            source=source,
            sha256=sha,
            size=size,
            final=str(dest(i, "fdl")),
            workdir=str(dest(i, "fdl").parent),
        )
        for i, w in enumerate(workers)
    ]
    with Fleet(workers, settings, collect([])) as connections:
        assert not connections.open([w.host for w in workers])
        started = time.monotonic()
        first = deliver(connections, targets, settings, lambda _: None)
        upload = time.monotonic() - started
        assert len(first.sent) == count, first
        started = time.monotonic()
        again = deliver(connections, targets, settings, lambda _: None)
        unchanged = time.monotonic() - started
        assert not again.sent and len(again.current) == count, again
    return {"fdl_sftp": upload, "fdl_unchanged": unchanged}


def run_scp(fleet: FleetRig, source: Path, count: int) -> float:
    started = time.monotonic()
    for i in range(count):
        target = f"root@{fleet.address(i)}:{dest(i, 'scp')}"
        argv = ["scp", "-q", *ssh_options(fleet), "-P", str(fleet.port), str(source), target]
        subprocess.run(argv, check=True)
    return time.monotonic() - started


def run_rsync(fleet: FleetRig, source: Path, count: int) -> float:
    shell = " ".join(["ssh", *ssh_options(fleet), "-p", str(fleet.port)])
    started = time.monotonic()
    processes = [
        subprocess.Popen(
            ["rsync", "-q", "-e", shell, str(source), f"root@{fleet.address(i)}:{dest(i, 'rsync')}"]
        )
        for i in range(count)
    ]
    assert all(p.wait() == 0 for p in processes)
    return time.monotonic() - started


def check(count: int, sha: str) -> None:
    for i in range(count):
        for method in ("fdl", "scp", "rsync"):
            assert hashlib.sha256(dest(i, method).read_bytes()).hexdigest() == sha, (i, method)


def measure(count: int, megabytes: int, windows: Sequence[int]) -> dict[str, object]:
    """One row: fdl at the first window (and again at each other), scp, rsync, side by side."""
    fleet = FleetRig(STATE / "fleet", port=2400, net="127.0.5")
    fleet.up(count)
    try:
        source = STATE / "ddp-bench"
        source.write_bytes(os.urandom(megabytes << 20))
        sha = hashlib.sha256(source.read_bytes()).hexdigest()
        clean(count)
        # warm-up: host keys learnt, page cache filled, outside the timings
        run_scp(fleet, source, 1)
        clean(count)
        row: dict[str, object] = {"hosts": count, "mb": megabytes, "window": windows[0]}
        row |= run_fdl(fleet, source, sha, count, windows[0])
        for other in windows[1:]:
            clean_fdl(count)
            row[f"fdl_sftp_window_{other}"] = run_fdl(fleet, source, sha, count, other)["fdl_sftp"]
        row["scp_sequence"] = run_scp(fleet, source, count)
        row["rsync_parallel"] = run_rsync(fleet, source, count)
        check(count, sha)
        return row
    finally:
        fleet.down()
        shutil.rmtree(STATE / "hosts", ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, nargs="+", default=[32])
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--window", type=int, nargs="+", default=[8])
    args = parser.parse_args(argv)
    STATE.mkdir(parents=True, exist_ok=True)
    rows = [measure(n, args.mb, args.window) for n in args.hosts]
    for row in rows:
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    for row in rows:
        fdl = float(row["fdl_sftp"])  # type: ignore[arg-type]
        print(
            f"{row['hosts']} hosts x {row['mb']} MB: fdl SFTP {fdl:.2f} s "
            f"(unchanged: {float(row['fdl_unchanged']):.2f} s), "  # type: ignore[arg-type]
            f"scp in sequence {float(row['scp_sequence']):.2f} s "  # type: ignore[arg-type]
            f"({float(row['scp_sequence']) / fdl:.2f}x), "  # type: ignore[arg-type]
            f"{row['hosts']} parallel rsync {float(row['rsync_parallel']):.2f} s "  # type: ignore[arg-type]
            f"({float(row['rsync_parallel']) / fdl:.2f}x)"  # type: ignore[arg-type]
        )
    meta = {"machine": f"{platform.node()} {os.cpu_count()} cores", "date": time.strftime("%F %T")}
    RESULTS.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
