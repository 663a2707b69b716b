"""The Invoke tasks: read options and settings, call the pipeline, report.

Progress and diagnostics go to stderr; stdout carries only what ``--json``
(or ``launch``'s program output) asks for. Every :class:`FdlError` becomes
one paragraph and exit code 1.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from fdl_tasks import pipeline
from fdl_tasks.envelope import encode
from fdl_tasks.errors import FdlError
from fdl_tasks.launch import launch as launch_on_workers
from fdl_tasks.rules import check_command
from fdl_tasks.run import Run
from fdl_tasks.settings import DEFAULTS

F = TypeVar("F", bound=Callable[..., Any])

HELP = {
    "cluster-file": "cluster.yaml to read (default: fdl.cluster_file, 'cluster.yaml')",
    "controller-host": "this machine's host label (default: $FLODL_HOST_NAME, else hostname)",
    "json": "print a machine-readable result on stdout",
    "cmd": "the command to build (cargo --bin name)",
    "crate-dir": "crate directory relative to controller.path (default: <cmd>/ if it holds "
    "a Cargo.toml, else the project root)",
    "no-cache": "build without the compile cache (sccache), every build from scratch",
}


def off(flag: bool) -> bool | None:
    """A ``--no-…`` option as a settings override: ``False`` when given, else the setting."""
    return False if flag else None


def user_errors(body: F) -> F:
    """Turn :class:`FdlError` into a clean message and exit 1, never a traceback."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except FdlError as exc:
            raise Exit(f"fdl: {exc}", code=1) from None
        except KeyboardInterrupt:
            raise Exit("fdl: interrupted", code=130) from None

    return wrapper  # type: ignore[return-value]


@task(
    help={
        "cluster-file": HELP["cluster-file"],
        "controller-host": HELP["controller-host"],
        "json": HELP["json"],
        "no-prebuild": "check only the data paths, not the ABI gate (no binary will ship)",
    }
)
@user_errors
def preflight(
    c: Context,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    no_prebuild: bool = False,
    json: bool = False,
) -> None:
    """Probe every host (ssh, in parallel) for readiness before any build."""
    run = Run.start(c, cluster_file=cluster_file, controller_host=controller_host)
    pipeline.preflight(run, abi=not no_prebuild, as_json=json)


@task(help={**HELP, "host": "the worker's host label in cluster.yaml"})
@user_errors
def build_host(
    c: Context,
    host: str,
    cmd: str,
    crate_dir: str | None = None,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    no_cache: bool = False,
    json: bool = False,
) -> None:
    """Build one host's binary against its own libtorch; print its envelope entry."""
    options = {"cluster_file": cluster_file, "controller_host": controller_host}
    run = Run.start(c, **options, compile_cache=off(no_cache))
    worker = run.cluster.worker(host)
    if worker.host == run.controller:
        raise FdlError(f"{host!r} is the controller: its build is the normal local build")
    command = check_command(cmd)
    crate = pipeline.resolve_crate_dir(run, crate_dir, command)
    entry = pipeline.build_one(run, worker, command, crate)
    if json and not run.dry:
        print(encode({host: entry}))


@task(
    help={
        **HELP,
        "jobs": "how many builds may run at once (default: fdl.build_jobs, else one per core)",
        "no-prebuild": "run only the data-path preflight; build and publish nothing",
        "per-host": "one build per host even where builds are identical (full isolation)",
        "no-verify": "skip delivery verification (hash, libraries, glibc) on the hosts",
        "timeout": "seconds one build may take (default: fdl.build_timeout)",
    }
)
@user_errors
def prebuild(
    c: Context,
    cmd: str,
    crate_dir: str | None = None,
    cluster_file: str | None = None,
    controller_host: str | None = None,
    jobs: int | None = None,
    no_prebuild: bool = False,
    per_host: bool = False,
    no_verify: bool = False,
    timeout: float | None = None,
    no_cache: bool = False,
    json: bool = False,
) -> None:
    """Preflight, then build CMD once per remote libtorch variant and publish the envelope."""
    run = Run.start(
        c,
        cluster_file=cluster_file,
        controller_host=controller_host,
        build_jobs=jobs,
        build_timeout=timeout,
        shared_builds=off(per_host),
        verify=off(no_verify),
        compile_cache=off(no_cache),
    )
    command = check_command(cmd)
    if no_prebuild:
        pipeline.preflight(run, abi=False, as_json=False)
        return
    crate = pipeline.resolve_crate_dir(run, crate_dir, command)
    text = pipeline.prebuild(run, command, crate)
    if json and text is not None:
        print(text)


def _remainder_args() -> list[str]:
    """Arguments after ``--`` on the ``inv`` command line, exactly as the shell split them.

    Invoke keeps the remainder only as one space-joined string, which would
    lose quoting, so the task reads them from ``sys.argv`` itself.
    """
    return sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []


@task(
    help={
        "cluster-file": HELP["cluster-file"],
        "controller-host": HELP["controller-host"],
        "cmd": "the command whose prebuilt binary to run",
    }
)
@user_errors
def launch(
    c: Context, cmd: str, cluster_file: str | None = None, controller_host: str | None = None
) -> None:
    """Run the prebuilt CMD on every remote worker (arguments after --); lines prefixed [host]."""
    run = Run.start(c, cluster_file=cluster_file, controller_host=controller_host)
    launch_on_workers(run, check_command(cmd), _remainder_args())


ns = Collection(preflight, build_host, prebuild, launch)
ns.configure({"fdl": dict(DEFAULTS)})
