"""Fleet scale, side by side: ``inv preflight`` vs OpenSSH clients (issues 12 and 40).

    python3 -m bench.fleet                    # 256, 1024, 2048, 4096 hosts, 1 repetition
    python3 -m bench.fleet --sizes 256,1024 --reps 3 --parallel 64

Brings up :class:`rig.fleetrig.FleetRig` (one real sshd per 16 loopback
addresses on 127.0.1.x-127.0.17.x:2300, every host healthy) and writes one
known_hosts file holding every host *hashed*, as Debian writes it
(``|1|salt|hmac`` of ``[address]:2300``). Both sides read that file and
nothing else, with ``StrictHostKeyChecking yes``. Per size, A and B alternate:

- A: ``inv preflight`` over the first N hosts, in steady state: a warm-up run
  at the largest size first (the names of the hashed lines are then
  remembered in the user's cache, as on a controller that ran before; the
  warm-up's own numbers, a first run's, are printed too);
- B: N OpenSSH clients running the same probe script, ``--parallel`` at a time
  (``xargs -P``; 64 is ClusterShell's default fan-out), with the same key and
  the key exchange paramiko negotiates (curve25519: OpenSSH's default
  post-quantum one costs ~100 ms more per connection).

For each: wall time, controller CPU per host (user + sys of the process tree,
from ``wait4``), the servers' CPU per host (the sshds and every session they
reaped, :meth:`FleetRig.server_cpu`), the whole machine's CPU per host
(``/proc/stat``: the sshds share the controller's 2 cores, so this is what
bounds wall time; it counts whatever else ran too), hosts
reported unreachable (every host is healthy, so each is a false one) and, for
``inv``, peak RSS and peak thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paramiko

from fdl_tasks.core.console import format_table
from fdl_tasks.preflight.probe import ProbeRequest
from fdl_tasks.ssh.answers import END
from rig.fleetrig import FleetRig
from rig.harness import inv_argv, rig_env, write_cluster, write_tasks_file

STATE = Path("/var/tmp/fdl-fleet")
SIZES = (256, 1024, 2048, 4096)
PARALLEL = 64  # ClusterShell's default fan-out


def wait_all(processes: Sequence[subprocess.Popen[Any]]) -> tuple[float, float]:
    """Wait for every process; their total CPU seconds and the largest peak RSS (MiB)."""
    cpu, peak = 0.0, 0.0
    for process in processes:
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = 0
        cpu += usage.ru_utime + usage.ru_stime
        peak = max(peak, usage.ru_maxrss / 1024)
    return cpu, peak


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent so far (every core, /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    busy = sum(int(x) for i, x in enumerate(fields) if i not in (3, 4))  # not idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def peak_threads(pid: int, stop: threading.Event, peak: list[int]) -> None:
    """Sample ``pid``'s thread count every 0.2 s until ``stop``; the largest in ``peak``."""
    status = Path(f"/proc/{pid}/status")
    while not stop.wait(0.2):
        try:
            text = status.read_text()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("Threads:"):
                peak[0] = max(peak[0], int(line.split()[1]))


def run_inv(fleet: FleetRig, work: Path, env: dict[str, str], count: int) -> dict[str, float]:
    """``inv preflight --json`` over ``count`` hosts."""
    started, machine, server = time.monotonic(), machine_cpu(), fleet.server_cpu()
    process = subprocess.Popen(
        inv_argv("preflight", "--json", "--cluster-file", f"cluster-{count}.yaml"),
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    stop, threads = threading.Event(), [0]
    sampler = threading.Thread(target=peak_threads, args=(process.pid, stop, threads))
    sampler.start()
    output = process.stdout.read() if process.stdout else ""
    stop.set()
    sampler.join()
    cpu, peak = wait_all([process])
    verdicts = json.loads(output or "[]")
    unreachable = sum(1 for v in verdicts if any("unreachable" in w for w in v["warnings"]))
    return {
        "wall": time.monotonic() - started,
        "cpu_ms_per_host": 1000 * cpu / count,
        "server_ms_per_host": 1000 * (fleet.server_cpu() - server) / count,
        "machine_ms_per_host": 1000 * (machine_cpu() - machine) / count,
        "unreachable": unreachable + count + 1 - len(verdicts),  # missing hosts count too
        "rss_mib": peak,
        "threads": threads[0],
    }


def openssh_argv(fleet: FleetRig, parallel: int, script: str) -> list[str]:
    """``xargs`` running one ``ssh`` per address read from stdin, ``parallel`` at a time."""
    return [
        "xargs",
        "-P",
        str(parallel),
        "-I",
        "@HOST@",
        "ssh",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={hashed_known_hosts(fleet)}",
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
        "-n",
        "root@@HOST@",
        script,
    ]


def run_openssh(fleet: FleetRig, count: int, parallel: int) -> dict[str, float]:
    """The probe on ``count`` hosts with OpenSSH clients, ``parallel`` at a time."""
    script = ProbeRequest(str(fleet.data), True, True).script()
    addresses = STATE / f"addresses-{count}"
    addresses.write_text("".join(f"{fleet.address(i)}\n" for i in range(count)))
    started, machine, server = time.monotonic(), machine_cpu(), fleet.server_cpu()
    with addresses.open() as stdin:
        process = subprocess.Popen(
            openssh_argv(fleet, parallel, script),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        output = process.stdout.read() if process.stdout else ""
    cpu, _ = wait_all([process])
    return {
        "wall": time.monotonic() - started,
        "cpu_ms_per_host": 1000 * cpu / count,
        "server_ms_per_host": 1000 * (fleet.server_cpu() - server) / count,
        "machine_ms_per_host": 1000 * (machine_cpu() - machine) / count,
        "unreachable": count - output.count(END),
    }


def hashed_known_hosts(fleet: FleetRig) -> Path:
    return fleet.state / "known_hosts.hashed"


def write_hashed_known_hosts(fleet: FleetRig, count: int) -> Path:
    """Every host's line, its name hashed as Debian's ``HashKnownHosts yes`` writes it."""
    keytype, key = (fleet.state / "host_key.pub").read_text().split()[:2]
    path = hashed_known_hosts(fleet)
    names = (f"[{fleet.address(i)}]:{fleet.port}" for i in range(count))
    path.write_text("".join(f"{paramiko.HostKeys.hash_host(n)} {keytype} {key}\n" for n in names))
    return path


def prepare(fleet: FleetRig, sizes: Sequence[int]) -> tuple[Path, dict[str, str]]:
    """The fleet up, the hashed known_hosts, one cluster file per size, a work dir."""
    fleet.up(max(sizes))
    known_hosts = write_hashed_known_hosts(fleet, max(sizes))
    work = STATE / "work"
    write_tasks_file(work)
    (work / "ssh_config").write_text("Host *\n  StrictHostKeyChecking yes\n")
    project = STATE / "project"
    project.mkdir(parents=True, exist_ok=True)
    for count in sizes:
        controller = {"path": str(project), "data_path": str(fleet.data)}
        write_cluster(
            work / f"cluster-{count}.yaml", controller, fleet.workers(count, str(project))
        )
    cache = STATE / "cache"
    shutil.rmtree(cache, ignore_errors=True)  # the warm-up is a first run
    extra = {"INVOKE_FDL_SSH_CONFIG": str(work / "ssh_config"), "XDG_CACHE_HOME": str(cache)}
    return work, rig_env(work, known_hosts, extra)


def measure(sizes: Sequence[int], reps: int, parallel: int) -> dict[str, Any]:
    fleet = FleetRig(STATE / "fleet")
    try:
        work, env = prepare(fleet, sizes)
        first = run_inv(fleet, work, env, max(sizes))  # a first run: the hashed names learnt
        print(f"fleet: first run at {max(sizes)} hosts: {first}", file=sys.stderr, flush=True)
        rows = []
        for count in sizes:
            samples: dict[str, list[dict[str, float]]] = {"inv": [], "openssh": []}
            for _ in range(reps):
                samples["inv"].append(run_inv(fleet, work, env, count))
                samples["openssh"].append(run_openssh(fleet, count, parallel))
            rows.append({"hosts": count, **{k: _medians(v) for k, v in samples.items()}})
            print(f"fleet: {count} hosts: {rows[-1]}", file=sys.stderr, flush=True)
        return {"first_run": {"hosts": max(sizes), **first}, "rows": rows}
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
            "server CPU/host (inv / openssh)",
            "machine CPU/host (inv / openssh)",
            "unreachable (inv / openssh)",
            "inv peak RSS",
            "inv peak threads",
        )
    ]
    for row in rows:
        inv, ssh = row["inv"], row["openssh"]
        lines.append(
            (
                str(row["hosts"]),
                f"{inv['wall']:.1f} s",
                f"{ssh['wall']:.1f} s",
                f"{inv['wall'] / ssh['wall']:.2f}",
                f"{inv['cpu_ms_per_host']:.1f} ms",
                f"{ssh['cpu_ms_per_host']:.1f} ms",
                f"{inv['server_ms_per_host']:.1f} / {ssh['server_ms_per_host']:.1f} ms",
                f"{inv['machine_ms_per_host']:.0f} / {ssh['machine_ms_per_host']:.0f} ms",
                f"{inv['unreachable']:.0f} / {ssh['unreachable']:.0f}",
                f"{inv['rss_mib']:.0f} MiB",
                f"{inv['threads']:.0f}",
            )
        )
    return format_table(lines, rule=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.fleet", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts")
    parser.add_argument("--reps", type=int, default=1, help="repetitions per size")
    parser.add_argument("--parallel", type=int, default=PARALLEL, help="OpenSSH clients at once")
    args = parser.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    load = os.getloadavg()
    results = measure(sizes, args.reps, args.parallel)
    print("\n".join(table(results["rows"])))
    print(
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    path = Path(__file__).resolve().parent / "fleet-results.json"
    meta = {"reps": args.reps, "parallel": args.parallel, "load_before": load}
    path.write_text(json.dumps({**meta, **results, "load_after": os.getloadavg()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
