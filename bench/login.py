"""A fresh login's first command, with the Fleet's transport and without its acknowledgements.

Run from the repository root, as root, under the rig's exclusive lock::

    flock -x /work/rig.lock python3 -m bench.login            # 20 repetitions
    flock -x /work/rig.lock python3 -m bench.login --reps 40

One run brings up 3 simulated hosts (sshd on 127.0.7.1-3). Each repetition logs
into the 3 at once and runs ``true`` twice on each (a preflight's probe, then a
verification), once with each transport, in alternating order:

- ``nodelay``: paramiko's transport with Nagle's algorithm off, as the Fleet's
  was before :class:`~fdl_tasks.ssh.transports.AckingSocket`;
- ``prompt``: the Fleet's own (:func:`~fdl_tasks.ssh.transports.prompt_transport`),
  which also acknowledges at once what the host sends.

Per phase, the median over the repetitions of the slowest of the 3 hosts: the
login, the first command, the second. Results go to ``bench/login-results.json``
with the machine and the date.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paramiko

from bench.loop import when_and_where
from fdl_tasks.ssh.transports import prompt_transport
from rig.harness import start_rig
from rig.sshrig import HostSpec

RESULTS = Path(__file__).resolve().parent / "login-results.json"
HOSTS = [HostSpec(f"ln{i}", f"127.0.7.{i}") for i in (1, 2, 3)]
PHASES = ("login", "first command", "second command")


def nodelay_transport(sock: Any, **options: Any) -> paramiko.Transport:
    """The Fleet's transport before acknowledgements were made prompt: Nagle's algorithm off."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return paramiko.Transport(sock, **options)


TRANSPORTS: dict[str, Callable[..., paramiko.Transport]] = {
    "nodelay": nodelay_transport,
    "prompt": prompt_transport,
}


def one_host(host: tuple[str, int], key: Path, factory: Callable[..., Any]) -> list[float]:
    """Seconds of the login, the first ``true`` and the second, on one host."""
    address, port = host
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    spans = [time.monotonic()]
    client.connect(
        address,
        port=port,
        username="root",
        key_filename=str(key),
        look_for_keys=False,
        allow_agent=False,
        transport_factory=factory,
    )
    spans.append(time.monotonic())
    for _ in range(2):
        _, stdout, _ = client.exec_command("true")
        stdout.channel.recv_exit_status()
        spans.append(time.monotonic())
    client.close()
    return [b - a for a, b in itertools.pairwise(spans)]


def measure(hosts: Sequence[tuple[str, int]], key: Path, reps: int) -> dict[str, list[list[float]]]:
    """Per transport, per repetition, the slowest host's seconds in each phase."""
    samples: dict[str, list[list[float]]] = {name: [] for name in TRANSPORTS}
    with ThreadPoolExecutor(len(hosts)) as pool:
        for rep in range(reps):
            order = list(TRANSPORTS) if rep % 2 == 0 else list(reversed(TRANSPORTS))
            for name in order:
                ask = functools.partial(one_host, key=key, factory=TRANSPORTS[name])
                spans = list(pool.map(ask, hosts))
                samples[name].append([max(s[i] for s in spans) for i in range(len(PHASES))])
    return samples


def report(samples: dict[str, list[list[float]]]) -> dict[str, Any]:
    medians = {
        name: {phase: statistics.median(s[i] for s in runs) for i, phase in enumerate(PHASES)}
        for name, runs in samples.items()
    }
    lines = ["| phase | nodelay | prompt | ratio |", "| --- | --- | --- | --- |"]
    for phase in PHASES:
        a, b = medians["nodelay"][phase], medians["prompt"][phase]
        lines.append(f"| {phase} | {1000 * a:.1f} ms | {1000 * b:.1f} ms | {b / a:.2f} |")
    print("\n".join(lines))
    return {"medians_seconds": medians, "samples_seconds": samples}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.login", description=__doc__)
    parser.add_argument("--reps", type=int, default=20, help="repetitions (default 20)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="fdl-bench-login-") as tmp,
        start_rig(Path(tmp), HOSTS) as rig,
    ):
        samples = measure([(h.address, h.port) for h in HOSTS], rig.rig.client_key, args.reps)
    result = {**when_and_where(load), "reps": args.reps, **report(samples)}
    RESULTS.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"results: {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
