"""``launch``: exec the prebuilt binary on every worker, straight from the envelope."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fdl_tasks.builder import PrefixedLines
from fdl_tasks.envelope import PerHostEnvelope
from fdl_tasks.model import Cluster, Worker
from fdl_tasks.remote import Fleet, describe_failure
from fdl_tasks.rules import check_command, join_path


def check_envelopes(
    envelopes: Mapping[str, PerHostEnvelope], workers: Sequence[Worker], command: str, source: str
) -> list[str]:
    """Why these envelopes cannot launch ``command`` on these workers (empty if they can)."""
    check_command(command)
    problems = []
    for worker in workers:
        entry = envelopes.get(worker.host)
        if entry is None:
            problems.append(f"{worker.host} has no entry in {source}")
        elif entry.bin.rsplit("/", 1)[-1] != command:
            problems.append(f"{worker.host}'s entry is for {entry.bin!r}, not {command!r}")
    return problems


def launch_command(
    worker: Worker, entry: PerHostEnvelope, cluster_env: Mapping[str, str], args: Sequence[str]
) -> str:
    """``cd`` into the crate dir, cluster env then worker env, direct exec.

    The envelope's ``LD_LIBRARY_PATH`` comes first; a worker's own
    ``LD_LIBRARY_PATH`` (e.g. bare-metal NCCL) is appended after it. The
    variables are exported by the shell rather than passed through env(1),
    which would take a binary path containing ``=`` for one more variable.
    """
    environment = {**cluster_env, **worker.env}
    extra = environment.get("LD_LIBRARY_PATH")
    environment["LD_LIBRARY_PATH"] = (
        f"{entry.ld_library_path}:{extra}" if extra else entry.ld_library_path
    )
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in environment.items())
    binary = join_path(worker.path, entry.bin)
    return (
        f"cd {shlex.quote(join_path(worker.path, entry.cwd_subpath))} && export {exports}"
        f" && exec {shlex.join([binary, *args])}"
    )


def launch_all(
    fleet: Fleet, cluster: Cluster, envelopes: Mapping[str, PerHostEnvelope], args: Sequence[str]
) -> dict[str, str]:
    """Run on every worker at once, lines prefixed ``[host]``; returns the failures."""

    def run(host: str) -> tuple[str, str]:
        worker = fleet.workers[host]
        stream = PrefixedLines(host, None, sys.stdout)
        command = launch_command(worker, envelopes[host], cluster.env, args)
        try:
            result: Any = fleet.connections[host].run(
                command,
                warn=True,
                hide=False,
                pty=False,
                in_stream=False,
                out_stream=stream,
                err_stream=stream,
            )
        except Exception as exc:  # any connection failure is that host's failure
            return host, describe_failure(exc, fleet.settings, worker).reason
        finally:
            stream.close_line()
        return host, "" if result.exited == 0 else f"exited {result.exited}"

    with ThreadPoolExecutor(max_workers=max(1, len(fleet.workers))) as pool:
        outcomes = dict(pool.map(run, sorted(fleet.workers)))
    return {host: why for host, why in outcomes.items() if why}
