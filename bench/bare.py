"""The bare build a benchmark compares ``inv prebuild`` with: the exact ``docker run``
line ``inv --dry prebuild`` prints for a one-host cluster, run as is."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.run import BenchError
from rig.harness import RigCluster, inv_argv


def bare_command(
    rig: RigCluster, cluster_file: Path, prebuild_args: Sequence[str], env: dict[str, str]
) -> list[str]:
    """The one ``docker run`` line of ``inv --dry prebuild <prebuild_args>``."""
    return bare_commands(rig, cluster_file, prebuild_args, env, count=1)[0]


def bare_commands(
    rig: RigCluster,
    cluster_file: Path,
    prebuild_args: Sequence[str],
    env: dict[str, str],
    count: int,
) -> list[list[str]]:
    """The ``count`` ``docker run`` lines of ``inv --dry prebuild <prebuild_args>``."""
    dry = subprocess.run(
        inv_argv("--dry", "prebuild", *prebuild_args, "--cluster-file", str(cluster_file)),
        cwd=rig.root,
        env=rig.environment(env),
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line.split("] ", 1)[1] for line in dry.stderr.splitlines() if "] docker run " in line]
    if dry.returncode != 0 or len(lines) != count:
        raise BenchError(f"expected {count} docker run line(s) from inv --dry:\n{dry.stderr}")
    return [shlex.split(line) for line in lines]


def bare(argv: list[str], name: str, n: int) -> float:
    """The bare build with a container name of its own (``<name>-<pid>-<n>``); wall seconds."""
    argv = list(argv)
    if "--name" in argv:
        argv[argv.index("--name") + 1] = f"{name}-{os.getpid()}-{n}"
    return timed(argv, "bare build")


def timed(argv: list[str], what: str) -> float:
    """Wall seconds of ``argv`` run to its end; :class:`BenchError` (``what`` and its
    stderr's tail) if it failed."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise BenchError(f"{what} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def bare_together(argvs: Sequence[list[str]], name: str, n: int) -> float:
    """Several bare builds started at once (each named ``<name>-<pid>-<n>-<i>``); the wall
    seconds until the last one ends."""
    started = time.monotonic()
    with ThreadPoolExecutor(len(argvs)) as pool:
        list(pool.map(lambda i: bare(argvs[i], f"{name}-{n}", i), range(len(argvs))))
    return time.monotonic() - started
