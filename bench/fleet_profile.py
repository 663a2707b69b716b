"""Where a fleet host's server-side CPU goes (issue 40): sshd itself, the shell, the probe.

    python3 -m bench.fleet_profile                  # 256 hosts
    python3 -m bench.fleet_profile --hosts 512
    python3 -m bench.fleet_profile --hosts 4096 --held-open

On the fleet rig (:class:`rig.fleetrig.FleetRig`), OpenSSH clients run one command
per host, in steps that each add one part of what a preflight costs a host:

- ``banner``: a TCP connection that reads sshd's banner and closes: sshd's fork and
  re-exec of itself (OpenSSH 9.2 re-executes sshd for every connection);
- ``kex, auth refused``: the client offers no method the server takes, so sshd's
  fork, re-exec and key exchange;
- ``exit 0``: the same, then public-key auth, the session and the login shell;
- ``probe``: the preflight probe script instead (:class:`ProbeRequest`, the one
  ``bench.fleet`` runs), then each line of it alone.

A step's server CPU is what the sshd daemons and every process they reaped spent
(:meth:`FleetRig.server_cpu`), so no other work on the machine
counts. The same probe lines run locally under ``bash -c`` are measured too (``local``),
with no sshd at all. ``inv`` is ``inv preflight`` over the same hosts: the server
CPU of paramiko's connections, against OpenSSH's.

``--held-open`` asks instead what holding connections costs the servers: the probe
with each connection closed when its host is done (as OpenSSH's clients do), then
with every connection held open until all hosts are done (as ``inv``'s fan-out holds
them; OpenSSH's ``ControlPersist``), then closed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.fleet import STATE, hashed_known_hosts, openssh_argv, prepare, run_inv, wait_all
from fdl_tasks.core.console import format_table
from fdl_tasks.preflight.probe import ProbeRequest
from rig.fleetrig import FleetRig

#: Parallel OpenSSH clients: CPU is what is measured here, not wall time.
PARALLEL = 16
LOCAL_RUNS = 200


def over_ssh(fleet: FleetRig, count: int, script: str, *options: str) -> tuple[float, float]:
    """``script`` on ``count`` hosts: server and client CPU per host, in ms."""
    argv = openssh_argv(fleet, PARALLEL, script)
    at = argv.index("ssh")  # xargs stops at ssh's 255, so a refusal exits 0
    argv[at : at + 1] = ["sh", "-c", 'ssh "$@" || :', "sh", *options]
    addresses = STATE / f"addresses-{count}"
    addresses.write_text("".join(f"{fleet.address(i)}\n" for i in range(count)))
    before = fleet.server_cpu()
    with addresses.open() as stdin:
        process = subprocess.Popen(
            argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client, _ = wait_all([process])
    return 1000 * (fleet.server_cpu() - before) / count, 1000 * client / count


def banners(fleet: FleetRig, count: int) -> float:
    """Connect to each host, read its banner, close: server CPU per host, in ms."""
    before = fleet.server_cpu()
    for i in range(count):
        with socket.create_connection((fleet.address(i), fleet.port), timeout=10) as sock:
            sock.recv(256)
    return 1000 * (fleet.server_cpu() - before) / count


def local(script: str) -> float:
    """``bash -c script`` here, no ssh: CPU per run in ms."""
    total = 0.0
    for _ in range(LOCAL_RUNS):
        process = subprocess.Popen(
            ["/bin/bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        total += wait_all([process])[0]
    return 1000 * total / LOCAL_RUNS


def held_open(fleet: FleetRig, count: int, script: str) -> float:
    """``script`` on ``count`` hosts, every connection held until all are done, then
    closed: server CPU per host in ms, once every session has been reaped."""
    control = STATE / "control"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir()
    argv = openssh_argv(fleet, PARALLEL, script)
    at = argv.index("ssh") + 1
    argv[at:at] = ["-o", "ControlMaster=auto", "-o", "ControlPersist=600"]
    argv[at:at] = ["-o", f"ControlPath={control}/%C"]
    addresses = STATE / f"addresses-{count}"
    addresses.write_text("".join(f"{fleet.address(i)}\n" for i in range(count)))
    before = fleet.server_cpu()
    for command in (argv, [*argv[: argv.index("-n")], "-O", "exit", "root@@HOST@"]):
        with addresses.open() as stdin:
            subprocess.run(command, stdin=stdin, capture_output=True, check=False)
    spent, settled = fleet.server_cpu(), 0
    while settled < 3:  # the closed sessions are reaped a little later
        time.sleep(1)
        now = fleet.server_cpu()
        settled = settled + 1 if now == spent else 0
        spent = now
    return 1000 * (spent - before) / count


def steps(data: str) -> list[tuple[str, str]]:
    """(name, script): the probe whole, then each of its lines alone."""
    script = ProbeRequest(data, True, True).script()
    lines = script.splitlines()
    return [("probe (whole)", script)] + [(f"  {line[:60]}", line) for line in lines[1:-2]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.fleet_profile", description=__doc__)
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--held-open", action="store_true", help="connections held, or not")
    args = parser.parse_args(argv)
    count = args.hosts
    fleet = FleetRig(STATE / "fleet")
    rows = [("step", "server CPU/host", "client CPU/host", "local bash -c")]
    try:
        work, env = prepare(fleet, [count])
        if args.held_open:
            script = ProbeRequest(str(fleet.data), True, True).script()
            server, client = over_ssh(fleet, count, script)
            rows.append(("probe, each connection closed when done", f"{server:.1f} ms", "", ""))
            server = held_open(fleet, count, script)
            rows.append(("probe, all held open until the end", f"{server:.1f} ms", "", ""))
            return _report(fleet, count, rows)
        rows.append(("banner", f"{banners(fleet, count):.1f} ms", "", ""))
        server, client = over_ssh(fleet, count, "exit 0", "-o", "PreferredAuthentications=password")
        rows.append(("kex, auth refused", f"{server:.1f} ms", f"{client:.1f} ms", ""))
        for name, script in [("exit 0", "exit 0"), *steps(str(fleet.data))]:
            server, client = over_ssh(fleet, count, script)
            cells = (f"{server:.1f} ms", f"{client:.1f} ms", f"{local(script):.2f} ms")
            rows.append((name, *cells))
            print(rows[-1], file=sys.stderr, flush=True)
        run_inv(fleet, work, env, count)  # a first run: the hashed names learnt
        inv = run_inv(fleet, work, env, count)
        cells = (f"{inv['server_ms_per_host']:.1f} ms", f"{inv['cpu_ms_per_host']:.1f} ms", "")
        rows.append(("inv preflight", *cells))
    finally:
        fleet.down()
    return _report(fleet, count, rows)


def _report(fleet: FleetRig, count: int, rows: list[tuple[str, str, str, str]]) -> int:
    print(f"{count} hosts, known_hosts {hashed_known_hosts(fleet)}, load {os.getloadavg()}")
    print("\n".join(format_table(rows, rule=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
