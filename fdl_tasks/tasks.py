"""The Invoke tasks: read options and settings, call the pipeline, report.

Progress and diagnostics go to stderr; stdout carries only what ``--json``
(or ``launch``'s program output) asks for. Flags and exits are
:mod:`fdl_tasks.cli`'s.
"""

from __future__ import annotations

import sys
from typing import Any

from invoke.collection import Collection
from invoke.context import Context

import fdl_tasks.publish.pipeline as pipeline
from fdl_tasks.api import crate_of, recorded_prebuild, start_build
from fdl_tasks.build.clean import clean_target_tree, stale_warning
from fdl_tasks.cli import ClusterChoice, fdl_task, off, require_command
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import namespace_defaults
from fdl_tasks.core.errors import FdlError
from fdl_tasks.inv_process import hook_command_line
from fdl_tasks.launch import launch as launch_on_workers
from fdl_tasks.publish.envelope import encode, hand_over
from fdl_tasks.publish.libtorch_push_io import push_libtorch as push_libtorch_to
from fdl_tasks.timings.recording import recorded

#: What another project may import from here: the tasks and their collection.
__all__ = ["build_host", "clean", "launch", "ns", "prebuild", "preflight", "push_libtorch"]


@fdl_task(
    help={
        "no-prebuild": "check data paths and directories only: no ABI gate, no build checks "
        "(no binary will ship)"
    }
)
def preflight(
    c: Context,
    where: ClusterChoice,
    no_prebuild: bool = False,
    verbose: bool = False,
    json: bool = False,
) -> None:
    """Probe every host (ssh, in parallel) for readiness before any build."""
    run = Run.start(c, **where, verbose=verbose or None, label="preflight")
    pipeline.preflight(run, abi=not no_prebuild, as_json=json)


@fdl_task(
    help={
        "json": "print the host's envelope entry on stdout",
        "host": "the worker's host label in the cluster file; required (only this host's "
        "binary is built and only its envelope entry changes)",
    }
)
def build_host(
    c: Context,
    where: ClusterChoice,
    host: str | None = None,
    cmd: str | None = None,
    crate_dir: str | None = None,
    no_cache: bool = False,
    no_warm: bool = False,
    timings: bool = False,
    verbose: bool = False,
    plain: bool = False,
    json: bool = False,
) -> None:
    """Build one host's binary against its own libtorch, verify it, update its envelope entry."""
    if not host:
        raise FdlError("--host is required: the label of the worker to build for")
    command = require_command(cmd)
    options: dict[str, Any] = {**where, "verbose": verbose or None, "plain": plain or None}
    run = Run.start(
        c,
        **options,
        compile_cache=off(no_cache),
        warm_containers=off(no_warm),
        timings=timings or None,
        label="build-host",
    )
    worker = run.cluster.worker(host)
    if worker.host == run.controller:
        raise FdlError(f"{host!r} is the controller: its build is the normal local build")
    crate = crate_of(run, command, crate_dir)
    with recorded(run, command) as timed:
        published = pipeline.build_one(timed, worker, command, crate)
    if published is None:
        return
    hand_over(published.text)
    entry = encode({host: published.entries[host]})
    run.report(f"build-host: envelope entry {entry}")
    if json:
        print(entry)


@fdl_task(
    help={
        "jobs": "how many builds may run at once (default: fdl.build_jobs, else one per "
        "core, two per core when every target dir is already built)",
        "no-prebuild": "run only preflight --no-prebuild; build and publish nothing",
        "per-host": "one build per host even where builds are identical (full isolation)",
        "no-verify": "skip delivery verification (hash, libraries, glibc) on the hosts",
        "require-verified": "fail when any host cannot be asked to verify its copy "
        "(fdl.require_verified all; default 'one': fail only when no host can be)",
        "timeout": "seconds one build may take (default: fdl.build_timeout, 3600)",
        "watch": "after the prebuild, rebuild and republish whenever a source changes",
    }
)
def prebuild(
    c: Context,
    where: ClusterChoice,
    cmd: str | None = None,
    crate_dir: str | None = None,
    jobs: int = 0,
    no_prebuild: bool = False,
    per_host: bool = False,
    no_verify: bool = False,
    require_verified: bool = False,
    timeout: int = 0,
    no_cache: bool = False,
    no_warm: bool = False,
    timings: bool = False,
    watch: bool = False,
    verbose: bool = False,
    plain: bool = False,
    json: bool = False,
) -> None:
    """Preflight, then build CMD once per remote build environment and publish its envelope.

    On a terminal each running build has one live line: its variant and hosts, cargo's
    units done out of the total, the time and the crates in flight. A diagnostic that
    several builds give is said once, naming them. The summary's cache column: compiler
    calls answered from the compile cache (sccache) out of the cacheable ones; dist R/C:
    units compiled on the build servers out of the units compiled; '-' when sccache was
    not asked (nothing compiled, or only binaries) or the cache is off.
    """
    command = require_command(cmd)
    options: dict[str, Any] = {**where, "verbose": verbose or None, "plain": plain or None}
    if no_prebuild:
        pipeline.preflight(Run.start(c, **options), abi=False)
        return
    options |= {
        "build_jobs": jobs or None,
        "build_timeout": timeout or None,
        "shared_builds": off(per_host),
        "verify": off(no_verify),
        "require_verified": require_verified or None,
        "compile_cache": off(no_cache),
        "warm_containers": off(no_warm),
        "timings": timings or None,
    }
    run, crate = start_build(c, command, crate_dir, **options)
    if watch:
        from fdl_tasks.watch.session import watch_and_rebuild

        watch_and_rebuild(run, command, crate, as_json=json)
        return
    hand_over(None)  # until this run publishes, no envelope of this process is valid
    published = recorded_prebuild(run, command, crate)
    if published is None:
        return
    hand_over(published.text)
    stale_warning(run)
    if json:
        print(published.text)


def _remainder_args() -> list[str]:
    """Arguments after ``--`` on the ``inv`` command line, exactly as the shell split them.

    Invoke keeps the remainder only as one space-joined string, which would
    lose quoting, so the task reads them from ``sys.argv`` itself.
    """
    return sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []


@fdl_task(
    help={
        "cmd": "the command whose prebuilt binary to run; required",
        "stale-ok": "launch binaries whose sources changed since they were built",
        "launcher": "fdl: flodl's launcher (fdl @<env> CMD --no-prebuild, one DDP world); "
        "direct: each worker's binary on its own, output prefixed [host] (default: "
        "fdl.launcher, auto: fdl on a flodl project)",
    }
)
def launch(
    c: Context,
    where: ClusterChoice,
    cmd: str | None = None,
    stale_ok: bool = False,
    launcher: str | None = None,
    verbose: bool = False,
) -> None:
    """Run the prebuilt CMD (arguments after --) through flodl's launcher, or directly."""
    command = require_command(cmd)
    verbosity = verbose or None
    run = Run.start(c, **where, launcher=launcher, verbose=verbosity, label="launch")
    launch_on_workers(run, command, _remainder_args(), stale_ok=stale_ok)


@fdl_task(
    help={
        "dry": "list what would be removed, remove nothing (like inv --dry clean)",
        "all": "remove every build tree under target/cluster/, in use or not, with the "
        "envelopes and timings pages (a running watcher's state and the lock stay)",
    }
)
def clean(c: Context, where: ClusterChoice, dry: bool = False, all: bool = False) -> None:
    """Remove target dirs under target/cluster/ that no current host, variant or image uses."""
    run = Run.start(c, **where, label="clean", workers_needed=False)
    clean_target_tree(run, list_only=dry or run.dry, everything=all)


@fdl_task(help={"host": "one copy host's label (default: every worker with delivery: copy)"})
def push_libtorch(c: Context, where: ClusterChoice, host: str | None = None) -> None:
    """Put each copy host's libtorch variant at <path>/libtorch/<arch>: changed files only."""
    run = Run.start(c, **where, label="push-libtorch")
    workers = [w for w in run.remotes if w.delivery == "copy"]
    if host:
        chosen = run.cluster.worker(host)
        if chosen.delivery != "copy":
            raise FdlError(f"{host} has delivery: shared: it sees the project's libtorch")
        workers = [chosen]
    push_libtorch_to(run, workers)


hook_command_line()
ns = Collection(preflight, build_host, prebuild, launch, clean, push_libtorch)
ns.configure({"fdl": namespace_defaults()})
