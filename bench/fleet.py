"""Fleet scale, side by side: ``inv preflight`` vs N parallel OpenSSH clients (issue 12).

    python3 -m bench.fleet                    # 32, 128, 256, 512 hosts, 3 repetitions
    python3 -m bench.fleet --sizes 32,256 --reps 5

Brings up :class:`rig.fleetrig.FleetRig` (one real sshd per 16 loopback
addresses on 127.0.1.x-127.0.3.x:2300, every host healthy) and, per size,
alternates A and B: A is ``inv preflight`` over the first N hosts; B is N
OpenSSH clients started at once running the same probe script, with the same
key, the same trust-on-first-use and the key exchange paramiko negotiates
(curve25519: OpenSSH's default post-quantum one costs ~100 ms more per
connection). Both known_hosts files are filled by a warm-up run first, as
they are on a controller in steady state. For each: wall time, controller
CPU per host (user + sys of the process tree, from ``wait4``), hosts reported
unreachable (every host is healthy, so each is a false one) and, for ``inv``,
peak RSS. The servers share the controller's cores here, so wall time is
mostly theirs; CPU per host is the controller's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fdl_tasks.core.console import format_table
from fdl_tasks.preflight.probe import ProbeRequest
from fdl_tasks.ssh.answers import END
from rig.fleetrig import FleetRig
from rig.harness import inv_argv, rig_env, write_cluster, write_tasks_file

STATE = Path("/var/tmp/fdl-fleet")
SIZES = (32, 128, 256, 512)


def wait_all(processes: Sequence[subprocess.Popen[Any]]) -> tuple[float, float]:
    """Wait for every process; their total CPU seconds and the largest peak RSS (MiB)."""
    cpu, peak = 0.0, 0.0
    for process in processes:
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = 0
        cpu += usage.ru_utime + usage.ru_stime
        peak = max(peak, usage.ru_maxrss / 1024)
    return cpu, peak


def run_inv(work: Path, env: dict[str, str], count: int) -> dict[str, float]:
    """``inv preflight --json`` over ``count`` hosts."""
    started = time.monotonic()
    process = subprocess.Popen(
        inv_argv("preflight", "--json", "--cluster-file", f"cluster-{count}.yaml"),
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    output = process.stdout.read() if process.stdout else ""
    cpu, peak = wait_all([process])
    verdicts = json.loads(output or "[]")
    unreachable = sum(1 for v in verdicts if any("unreachable" in w for w in v["warnings"]))
    return {
        "wall": time.monotonic() - started,
        "cpu_ms_per_host": 1000 * cpu / count,
        "unreachable": unreachable + count + 1 - len(verdicts),  # missing hosts count too
        "rss_mib": peak,
    }


def openssh_argv(fleet: FleetRig, index: int, script: str) -> list[str]:
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        f"UserKnownHostsFile={fleet.state / 'known_hosts.openssh'}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "KexAlgorithms=curve25519-sha256",
        "-i",
        str(fleet.client_key),
        "-p",
        str(fleet.port),
        f"root@{fleet.address(index)}",
        script,
    ]


def run_openssh(fleet: FleetRig, count: int) -> dict[str, float]:
    """``count`` OpenSSH clients at once, each running the probe on its host."""
    script = ProbeRequest(str(fleet.data), True, True).script()
    started = time.monotonic()
    processes = [
        subprocess.Popen(
            openssh_argv(fleet, i, script),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(count)
    ]
    answers = [p.stdout.read() if p.stdout else "" for p in processes]
    cpu, _ = wait_all(processes)
    return {
        "wall": time.monotonic() - started,
        "cpu_ms_per_host": 1000 * cpu / count,
        "unreachable": sum(1 for a in answers if END not in a),
    }


def prepare(fleet: FleetRig, sizes: Sequence[int]) -> tuple[Path, dict[str, str]]:
    """The fleet up, one cluster file per size, a work dir with tasks.py."""
    fleet.up(max(sizes))
    work = STATE / "work"
    write_tasks_file(work)
    project = STATE / "project"
    project.mkdir(parents=True, exist_ok=True)
    for count in sizes:
        controller = {"path": str(project), "data_path": str(fleet.data)}
        write_cluster(
            work / f"cluster-{count}.yaml", controller, fleet.workers(count, str(project))
        )
    return work, rig_env(work, fleet.state / "known_hosts")


def measure(sizes: Sequence[int], reps: int) -> list[dict[str, Any]]:
    fleet = FleetRig(STATE / "fleet")
    try:
        work, env = prepare(fleet, sizes)
        run_inv(work, env, max(sizes))  # warm-up: both known_hosts files filled
        run_openssh(fleet, max(sizes))
        rows = []
        for count in sizes:
            samples: dict[str, list[dict[str, float]]] = {"inv": [], "openssh": []}
            for _ in range(reps):
                samples["inv"].append(run_inv(work, env, count))
                samples["openssh"].append(run_openssh(fleet, count))
            rows.append({"hosts": count, **{k: _medians(v) for k, v in samples.items()}})
            print(f"fleet: {count} hosts done", file=sys.stderr, flush=True)
        return rows
    finally:
        fleet.down()


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        (
            "hosts",
            "inv wall",
            "openssh wall",
            "ratio",
            "inv CPU/host",
            "openssh CPU/host",
            "inv unreachable",
            "openssh unreachable",
            "inv peak RSS",
        )
    ]
    for row in rows:
        inv, ssh = row["inv"], row["openssh"]
        lines.append(
            (
                str(row["hosts"]),
                f"{inv['wall']:.2f} s",
                f"{ssh['wall']:.2f} s",
                f"{inv['wall'] / ssh['wall']:.2f}",
                f"{inv['cpu_ms_per_host']:.1f} ms",
                f"{ssh['cpu_ms_per_host']:.1f} ms",
                f"{inv['unreachable']:.0f}",
                f"{ssh['unreachable']:.0f}",
                f"{inv['rss_mib']:.0f} MiB",
            )
        )
    return format_table(lines, rule=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.fleet", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per size")
    args = parser.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    rows = measure(sizes, args.reps)
    print("\n".join(table(rows)))
    results = Path(__file__).resolve().parent / "fleet-results.json"
    results.write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
