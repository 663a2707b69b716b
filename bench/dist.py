"""Distributed compiles, side by side: a cold prebuild of 3 variants with sccache-dist on vs off.

    python3 -m bench.dist                 # 3 repetitions, Docker builds
    python3 -m bench.dist --reps 5 --native

The project and hosts of :mod:`bench.cache` (the flodl-shaped crate at benchmark
size, three variants whose headers differ, three hosts with real sshd), plus an
sccache-dist scheduler and one build server on loopback (:mod:`rig.dist`). Every
cold run starts from an empty ``target/`` and an empty compile cache; both sides
use the compile cache, so the only difference is where the compiles run.

- 7a: cold ``inv prebuild`` of the 3 variants, dist on vs off (A and B alternate);
- 7b: the once-per-machine cost: the first dist run of the session, with an empty
  compiler package store (sccache packs the Rust compiler, ~200 MB, and sends it to
  the server), vs the same with the store warm.

On one 2-core machine the build server shares the cores with the client, so
distributing cannot be faster: every compile still runs here, plus packing the
inputs, HTTP, the sandbox and unpacking the outputs. The figures measure that
overhead; the gain needs servers with cores of their own (see the report).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import flodl_crate
from bench.cache import CACHE, VARIANTS, CacheBench
from bench.run import STATE, BenchError, Comparison, log, machine_facts, median, table
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.interrupts import sigterm_as_interrupt
from rig.dist import DistRig, ServerSpec
from rig.harness import builder_settings, rig_worker, write_cluster

RESULTS = Path(__file__).resolve().parent / "dist-results.json"
#: The compiler packages sccache-dist packs (its "toolchains", the directory's name).
COMPILER_PACKAGES = Path(f"{CACHE}-dist") / "toolchains"


class DistBench(CacheBench):
    """The cache bench's rig and project, and an sccache-dist farm on loopback."""

    def __init__(self, reps: int, docker: bool) -> None:
        super().__init__(reps, docker=docker)
        self.farm = DistRig(STATE / "dist-rig", [ServerSpec()], scheduler_port=0, tied=True)
        self.remote: list[dict[str, str]] = []

    def up(self) -> None:
        super().up()
        self.farm.up()
        log(f"dist: scheduler {self.farm.url}, 1 build server (bubblewrap)")

    def down(self) -> None:
        self.farm.down()
        super().down()

    def dist_cluster(self, name: str, dist: bool) -> Path:
        root = self.project / "flodl"
        controller: dict[str, Any] = {"path": str(root), "data_path": str(root)}
        if self.docker:
            docker = builder_settings(self.owner)
            docker["run_args"] = [*docker["run_args"], "--network=host"]  # a loopback scheduler
            controller["docker"] = docker
        if dist:
            controller["dist"] = self.farm.dist_settings()
        workers = [
            rig_worker(self.rig, f"b{i + 1:02d}", root, arch=arch)
            for i, arch in enumerate(VARIANTS)
        ]
        return write_cluster(self.work / name, controller, workers)

    def cold_prebuild(self, cluster: Path) -> float:
        """A cold ``inv prebuild`` (empty target tree and cache; compiler packages kept)."""
        shutil.rmtree(self.project / "flodl" / "target", ignore_errors=True)
        shutil.rmtree(CACHE, ignore_errors=True)
        run = self.inv("prebuild", "--cmd", flodl_crate.COMMAND, "--cluster-file", str(cluster))
        self.remote.append(cache_cells(run.stderr))
        return run.seconds


def cache_cells(stderr: str) -> dict[str, str]:
    """host → the summary's cache cell (``0/8 hits, dist 8/8``)."""
    rows = [re.split(r" {2,}", line.strip()) for line in stderr.splitlines()]
    header = next((row for row in rows if row[:2] == ["host", "arch"] and "cache" in row), None)
    if header is None:
        return {}
    index = header.index("cache")
    return {
        row[0]: row[index]
        for row in rows[rows.index(header) + 1 :]
        if len(row) == len(header) and row[0].startswith("b")
    }


def compare(bench: DistBench) -> list[Comparison]:
    on = bench.dist_cluster("dist-on.yaml", dist=True)
    off = bench.dist_cluster("dist-off.yaml", dist=False)
    cold = Comparison("7a", "cold prebuild, 3 variants", "dist on", "dist off", "on/off", "report")
    first = Comparison(
        "7b",
        "first dist run: compiler package packed",
        "empty store",
        "warm store",
        "first/warm",
        "report",
    )
    shutil.rmtree(COMPILER_PACKAGES, ignore_errors=True)
    packed = bench.cold_prebuild(on)
    for rep in range(bench.reps):
        with_dist = bench.cold_prebuild(on)
        without = bench.cold_prebuild(off)
        cold.record(with_dist, without)
        if rep == 0:
            first.record(packed, with_dist)
        log(f"dist rep {rep + 1}: on {with_dist:.1f}s, off {without:.1f}s")
    cold.conclude(median(cold.a) / median(cold.b), None, [])
    first.conclude(median(first.a) / median(first.b), None, [])
    cold.notes.append(f"cache column of the dist runs: {bench.remote[1::2]}")
    first.notes.append(f"cache column of the first run: {bench.remote[0]}")
    return [cold, first]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.dist", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--native", action="store_true", help="native cargo instead of Docker")
    args = parser.parse_args(argv)
    bench = DistBench(args.reps, docker=not args.native)
    facts = machine_facts(args.reps, False, bench.docker)
    with sigterm_as_interrupt():
        try:
            bench.up()
            results = compare(bench)
        except (BenchError, KeyboardInterrupt) as exc:
            log(f"aborted: {exc or 'interrupted'}")
            return 1
        finally:
            bench.down()
    payload = {
        **facts,
        "mode": bench.mode,
        "build_servers": 1,
        "comparisons": [c.to_json() for c in results],
    }
    write_atomically(RESULTS, json.dumps(payload, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
