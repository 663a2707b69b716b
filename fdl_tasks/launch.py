"""``launch``: the prebuilt binaries started, through flodl's launcher or directly.

On a flodl project, flodl's own launcher runs the job: ``fdl @<env> CMD
--no-prebuild ARGS`` in the project root, with the published envelope in
``FLODL_INTERNAL_PREBUILD_PER_HOST``. The training binary is the launcher
on the controller: it opens the join window, forms the world and starts each
host's agent from the envelope's binary, so a DDP run is one process group.
The direct mode execs every worker's binary from the envelope over ssh, for
programs that are not flodl launchers: it forms no world.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

from fdl_tasks.config.launch_mode import (
    DIRECT_NOTE,
    ENV_PREBUILD_PER_HOST,
    FDL,
    fdl_argv,
    launch_mode,
)
from fdl_tasks.config.model import Cluster, FlodlOrigin, Worker
from fdl_tasks.config.names import check_command, join_path
from fdl_tasks.config.run import Run
from fdl_tasks.core.console import PrefixedLines
from fdl_tasks.core.errors import FdlError, ProgramExited, Stopped
from fdl_tasks.core.interrupts import forwarding_signals, sigterm_as_interrupt
from fdl_tasks.publish.envelope import PerHostEnvelope, read_published
from fdl_tasks.publish.freshness import stale_binary
from fdl_tasks.ssh.outcomes import Failure
from fdl_tasks.ssh.remote import Fleet
from fdl_tasks.watch.launchwait import wait_for_watch


def check_envelopes(
    envelopes: Mapping[str, PerHostEnvelope], workers: Sequence[Worker], command: str, source: str
) -> list[str]:
    """Why these envelopes cannot launch ``command`` on these workers (empty if they can)."""
    check_command(command)
    problems = []
    for worker in workers:
        if (entry := envelopes.get(worker.host)) is None:
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


def launch_line(
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
    workers = fleet.workers
    lines = {h: launch_line(w, envelopes[h], cluster.env, args) for h, w in workers.items()}
    streams = {host: PrefixedLines(host, None, sys.stdout) for host in workers}
    try:
        with sigterm_as_interrupt():
            outcomes = fleet.run(lines, None, streams)
    except KeyboardInterrupt:
        binaries = {h: join_path(w.path, envelopes[h].bin) for h, w in workers.items()}
        stops = {h: stop_processes(binary, GRACE_SECONDS) for h, binary in binaries.items()}
        fleet.run(stops, GRACE_SECONDS + fleet.settings.probe_timeout)
        raise
    finally:
        for stream in streams.values():
            stream.close_line()
    return {
        host: outcome.reason if isinstance(outcome, Failure) else f"exited {outcome.exited}"
        for host, outcome in sorted(outcomes.items())
        if isinstance(outcome, Failure) or outcome.exited != 0
    }


def launch(run: Run, command: str, args: Sequence[str], stale_ok: bool = False) -> None:
    """``inv launch``: the envelope checked against the cluster file and the sources on
    disk (``stale_ok``: not the sources), then the run."""
    mode = launch_mode(run.settings.launcher, run.cluster.origin, run.cluster.source)
    remotes = run.remotes
    run.note_unlisted_controller()
    if not run.dry:  # a `prebuild --watch` cycle in flight publishes first
        wait_for_watch(run.root, command, run.settings.launch_wait, run.report)
    envelopes, source, text = read_published(run.root, command)
    if problems := check_envelopes(envelopes, remotes, command, source):
        raise FdlError(
            f"the envelope does not match {run.cluster.source} (stale? run prebuild "
            "again): " + "; ".join(problems)
        )
    if not stale_ok and (stale := stale_binary(run.root, command, [w.host for w in remotes])):
        raise FdlError(stale)
    if mode == "fdl":
        assert run.cluster.origin is not None and run.cluster.origin.root is not None
        launch_with_fdl(run, run.cluster.origin, command, args, text)
    else:
        launch_direct(run, command, envelopes, args)


def launch_with_fdl(
    run: Run, origin: FlodlOrigin, command: str, args: Sequence[str], envelope: str
) -> None:
    """flodl's launcher in the project root, the envelope in its variable; its output and
    exit code are the task's, and a signal to the task is passed on to it."""
    argv = fdl_argv(origin.env, command, args)
    if run.dry:
        variable = f"{ENV_PREBUILD_PER_HOST}={shlex.quote(envelope)}"
        run.report(f"cd {shlex.quote(origin.root or '.')} && {variable} {shlex.join(argv)}")
        return
    program = shutil.which(FDL)
    if program is None:
        raise FdlError(
            "fdl (flodl's command-line tool) is not on PATH: it runs flodl's launcher "
            f"({shlex.join(argv[:3])}). Install flodl-cli, or run --launcher direct (each "
            "binary on its own, no world formed)"
        )
    run.say(f"flodl's launcher: {shlex.join(argv)} (in {origin.root})")
    environment = {**os.environ, ENV_PREBUILD_PER_HOST: envelope}
    process = subprocess.Popen(
        [program, *argv[1:]], cwd=origin.root, env=environment, process_group=0
    )
    with forwarding_signals(process):
        code = process.wait()
    if code != 0:
        raise ProgramExited(128 - code if code < 0 else code)


def launch_direct(
    run: Run, command: str, envelopes: Mapping[str, PerHostEnvelope], args: Sequence[str]
) -> None:
    """Every remote worker's binary over ssh, each on its own."""
    remotes = run.remotes
    run.say(DIRECT_NOTE)
    if run.dry:
        for worker in remotes:
            line = launch_line(worker, envelopes[worker.host], run.cluster.env, args)
            run.report(f"[{worker.host}] {line}")
        return
    with Fleet(remotes, run.settings, run.report) as fleet:
        try:
            failed = launch_all(fleet, run.cluster, envelopes, args)
        except KeyboardInterrupt:
            raise Stopped(f"interrupted: {command} was stopped on every host") from None
    if failed:
        raise FdlError("launch failed on " + ", ".join(f"{h} ({why})" for h, why in failed.items()))
    run.say(f"{command} finished on {len(remotes)} host(s)")
