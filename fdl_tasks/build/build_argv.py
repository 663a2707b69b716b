"""The parts every build mode's command line shares: cargo's argv, labels, quoting.

Pure logic. Each mode's whole command line is built by its backend
(:mod:`fdl_tasks.build.backends`); every value is shell-quoted once, there or here,
and the rest of the code runs those strings as they are (``inv --dry``
prints them).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from fdl_tasks.build.build_environment import Build, BuildJob
from fdl_tasks.build.cargo_output import PROGRESS_FLAGS
from fdl_tasks.cache.compile_cache import CONTAINER_TARGET, CompileCache
from fdl_tasks.cargo.cross_targets import cross_env
from fdl_tasks.config.model import Controller
from fdl_tasks.config.names import join_path

#: Labels every build container of a run, so a run can find and stop its own.
RUN_LABEL = "fdl-tasks.run"
#: Names the job a build container belongs to (to stop one timed-out build).
JOB_LABEL = "fdl-tasks.job"
#: Where a container's sccache server listens (the container's own /tmp).
CONTAINER_SERVER = "/tmp/fdl-sccache.sock"


def assignments(variables: Mapping[str, str]) -> str:
    """``NAME=value …`` for a shell, each value quoted on its own (a quoted
    ``'NAME=value'`` word would be run as a command)."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())


def cargo_argv(build: Build) -> list[str]:
    """``cargo build --release [--features cuda] [--target T] --bin <cmd>`` (flodl's order),
    then cargo's progress bar asked for even through a pipe (:data:`PROGRESS_FLAGS`)."""
    features = ["--features", ",".join(build.features)] if build.features else []
    target = ["--target", build.cross.target] if build.cross else []
    timings = ["--timings"] if build.timings else []
    build_flags = [*features, *target, *timings, "--bin", build.command]
    return ["cargo", "build", "--release", *build_flags, *PROGRESS_FLAGS]


def cross_variables(build: Build) -> dict[str, str]:
    """The cross linker (and C/C++ compilers) for a cross build; none otherwise."""
    return cross_env(build.cross.target, build.cross.linker) if build.cross else {}


def container_name(run_id: str, job: BuildJob) -> str:
    return f"fdl-{run_id}-{job.name.replace('/', '-').lstrip('_')}"


def container_identity(run_id: str, job: BuildJob) -> list[str]:
    """A name and the labels by which a run finds (and stops) its own containers."""
    return [
        "--name",
        container_name(run_id, job),
        "--label",
        f"{RUN_LABEL}={run_id}",
        "--label",
        f"{JOB_LABEL}={job.name}",
    ]


def container_cache(
    job: BuildJob, controller: Controller, workspace: str, cache: CompileCache | None
) -> tuple[list[str], str]:
    """``-v``/``-e`` flags for the compile cache, and the target dir the container builds in.

    With the cache every build's target dir is mounted at one container path,
    so that the paths sccache hashes are equal across variants.
    """
    if cache is None:
        return [], join_path(workspace, job.target_dir)
    flags = ["-v", f"{join_path(controller.path, job.target_dir)}:{CONTAINER_TARGET}"]
    for mount in cache.container_mounts():
        flags += ["-v", mount]
    for name, value in cache.container_variables(CONTAINER_SERVER).items():
        flags += ["-e", f"{name}={value}"]
    return flags, CONTAINER_TARGET
