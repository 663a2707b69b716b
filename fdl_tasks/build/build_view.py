"""How a build is named and said while it runs: its label, its lines, its last run's time.

Pure. A person knows a build by its variant (``cu128``, ``cpu``) and the hosts
it serves, not by its target dir's id; the id is added only where two builds
share a variant. The log's last line says how long cargo ran, which is the
next run's estimate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fdl_tasks.build.build_environment import Build, BuildJob
from fdl_tasks.core.console import listed

_RAN = re.compile(r"^fdl-tasks: cargo ran ([0-9.]+) s, exit 0$")


def variant_name(build: Build) -> str:
    """``cu128`` for ``precompiled/cu128``; ``cu128-aarch64`` for its cross build (once,
    for a variant named so already)."""
    name = build.arch.rsplit("/", 1)[-1]
    cpu = build.cpu_arch
    return f"{name}-{cpu}" if cpu and not name.endswith(cpu) else name


def job_labels(jobs: Sequence[BuildJob]) -> dict[str, str]:
    """Each job's label by its name: its variant, plus its id (its host for a per-host
    build) where two jobs share the variant."""
    names = {job.name: variant_name(job.build) for job in jobs}
    counts = list(names.values())
    labels = {}
    for job in jobs:
        label = names[job.name]
        if counts.count(label) > 1:
            own = job.name if job.name in job.hosts else job.name.rsplit("-", 1)[-1]
            label = f"{label}/{own}"
        labels[job.name] = label
    return labels


def titled(label: str, hosts: Sequence[str]) -> str:
    """``cu128 (alpha, beta)``: the build and whom it serves."""
    return f"{label} ({listed(hosts, 4)})"


def own_strings(job: BuildJob) -> list[str]:
    """What differs between builds of one program besides the code: set aside when
    diagnostics are compared."""
    return [job.target_dir, job.name, *([job.build.arch] if "/" in job.build.arch else [])]


def result_line(
    task: str, title: str, *, ok: bool, seconds: float, detail: str = "", stopped: bool = False
) -> str:
    """``prebuild: cu128 (alpha) ok in 12.3s``, ``FAILED (why)``, or ``stopped`` (by the
    user: no failure)."""
    if ok:
        state = f"ok ({detail})" if detail else "ok"
    else:
        state = "stopped" if stopped else f"FAILED ({detail})"
    return f"{task}: {title} {state} in {seconds:.1f}s"


def ran_line(seconds: float, exit_code: int) -> str:
    """The log's last line: how long cargo ran (a good run's is the next estimate)."""
    return f"fdl-tasks: cargo ran {seconds:.1f} s, exit {exit_code}"


def standby_lost_line(container: str, exit_code: int) -> str:
    """In a build's log: the docker exec that waited for it in ``container`` ended before
    running it (its container stopped, its processes killed by a stop), so it runs anew."""
    return (
        f"fdl-tasks: the docker exec waiting in {container} ended (exit {exit_code}) before "
        "the build began: the build runs in a docker exec of its own"
    )


def last_run_seconds(log_tail: str) -> float | None:
    """How long the last good run of this build took, from its log's last line."""
    lines = log_tail.splitlines()
    found = _RAN.match(lines[-1]) if lines else None
    return float(found[1]) if found else None
