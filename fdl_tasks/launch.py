"""``launch``: exec the prebuilt binary on every worker, straight from the envelope."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fdl_tasks.console import PrefixedLines
from fdl_tasks.envelope import PerHostEnvelope
from fdl_tasks.interrupts import sigterm_as_interrupt
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


#: Seconds a worker's process has between TERM and KILL, as flodl's launcher gives it.
GRACE_SECONDS = 10
#: Seconds stale orphans get between TERM and KILL before a spawn and after a run.
ORPHAN_GRACE_SECONDS = 1
_ERE_SPECIAL = re.compile(r"([\\.\[\]{}()*+?^$|])")


def process_pattern(binary: str) -> str:
    """An extended regex for ``pkill -f`` matching processes whose command is ``binary``.

    Anchored at the start of the command line, so the wrapper shell (whose
    command line is ``bash -c …``) and pkill itself never match.
    """
    return "^" + _ERE_SPECIAL.sub(r"\\\1", binary) + "( |$)"


def stop_processes(binary: str, grace: int) -> str:
    """Shell: TERM every process of ``binary``, KILL what is left after ``grace`` seconds.

    Does nothing where ``pkill`` is missing (preflight warns about those hosts).
    """
    pattern = shlex.quote(process_pattern(binary))
    return (
        f"if command -v pkill >/dev/null 2>&1 && pkill -TERM -f {pattern}; then "
        f"__fdl_wait={grace * 5}; "
        f'while [ "$__fdl_wait" -gt 0 ] && pgrep -f {pattern} >/dev/null; do '
        "sleep 0.2; __fdl_wait=$((__fdl_wait - 1)); done; "
        f"pkill -KILL -f {pattern}; fi"
    )


def launch_command(
    worker: Worker, entry: PerHostEnvelope, cluster_env: Mapping[str, str], args: Sequence[str]
) -> str:
    """flodl's remote launch: clear orphans, spawn, forward hang-up/TERM/INT, wait, clear.

    ``cd`` into the crate dir; cluster env, then worker env; the envelope's
    ``LD_LIBRARY_PATH`` unless either env sets one (the user's explicit choice
    wins). The binary runs in the background so that a hang-up, TERM or INT of
    the session reaches it as TERM, then KILL after :data:`GRACE_SECONDS`.
    Variables are exported by the shell, not passed through env(1), which
    would take a binary path containing ``=`` for one more variable.
    """
    environment = {**cluster_env, **worker.env}
    environment.setdefault("LD_LIBRARY_PATH", entry.ld_library_path)
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in environment.items())
    binary = join_path(worker.path, entry.bin)
    forward = (
        'kill -TERM "$__fdl_pid" 2>/dev/null; '
        f'( sleep {GRACE_SECONDS}; kill -KILL "$__fdl_pid" 2>/dev/null ) >/dev/null 2>&1 &'
    )
    return "\n".join(
        [
            f"cd {shlex.quote(join_path(worker.path, entry.cwd_subpath))} || exit 1",
            f"export {exports}",
            stop_processes(binary, ORPHAN_GRACE_SECONDS),
            f"{shlex.join([binary, *args])} &",
            "__fdl_pid=$!",
            f"trap {shlex.quote(forward)} HUP TERM INT",
            'wait "$__fdl_pid"; __fdl_status=$?',
            'while kill -0 "$__fdl_pid" 2>/dev/null; do wait "$__fdl_pid"; __fdl_status=$?; done',
            stop_processes(binary, ORPHAN_GRACE_SECONDS),
            'exit "$__fdl_status"',
        ]
    )


def launch_all(
    fleet: Fleet, cluster: Cluster, envelopes: Mapping[str, PerHostEnvelope], args: Sequence[str]
) -> dict[str, str]:
    """Run on every worker at once, lines prefixed ``[host]``; returns the failures.

    Ctrl-C or SIGTERM stops the program on every host (TERM, then KILL after
    the grace period) before the interrupt propagates.
    """

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

    pool = ThreadPoolExecutor(max_workers=max(1, len(fleet.workers)))
    try:
        with sigterm_as_interrupt():
            outcomes = dict(pool.map(run, sorted(fleet.workers)))
    except KeyboardInterrupt:
        binaries = {h: join_path(w.path, envelopes[h].bin) for h, w in fleet.workers.items()}
        stops = {h: stop_processes(binary, GRACE_SECONDS) for h, binary in binaries.items()}
        fleet.run(stops, GRACE_SECONDS + fleet.settings.probe_timeout)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {host: why for host, why in outcomes.items() if why}
