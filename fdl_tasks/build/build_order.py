"""How a prebuild's builds are ordered: how many at once, and whether one goes first.

Decided from the target dirs' markers and the compile cache alone, before any
build starts, and said in one line as the run will do it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.config.layout import MARKER_FILE


def concurrency(configured: int, jobs: Sequence[BuildJob], root: Path) -> int:
    """How many of ``jobs`` run at once: ``configured`` (``fdl.build_jobs``) when set.

    Else one per core while any target dir is still cold: a cold build keeps
    every core busy by itself, more at once only oversubscribe them. Once
    every target dir holds a build, a rebuild is incremental (one crate and a
    link on one core) and most of its wall time is spent starting its
    container and linking: then up to two per core run together, which
    overlaps those waits (3 variants on 2 cores, a one-line edit: 3.71 s to
    3.34 s; the builds of a no-op: 0.93 s to 0.76 s).
    """
    cores = os.cpu_count() or 1
    bound = configured or (2 * cores if _all_warm(jobs, root) else cores)
    return max(1, min(bound, len(jobs)))


def head_start(*, cached: bool, cold: bool, builds: int, dependencies: bool = False) -> int:
    """How many builds run before the others start: one when the compile cache can be
    warmed for the rest (every target dir cold, or ``dependencies`` changed since the
    last builds: :mod:`fdl_tasks.cargo.manifests`), else none (without a cache nothing waits)."""
    return 1 if cached and (cold or dependencies) and builds > 1 else 0


def order_text(builds: int, at_once: int, first: int, dependencies: bool) -> str:
    """How the builds will run, as the run will run them (``first``: :func:`head_start`)."""
    if not first:
        return f"{at_once} at a time"
    why = " with the changed dependencies" if dependencies else ""
    then = min(at_once, builds - first)
    return f"the first build alone to fill the cache{why}, then {then} at a time"


def _all_warm(jobs: Sequence[BuildJob], root: Path) -> bool:
    return all((root / job.target_dir / MARKER_FILE).exists() for job in jobs)
