"""The compile cache, side by side (issue 14): k variants should cost about one cold build.

    python3 -m bench.cache                 # 3 repetitions, Docker builds
    python3 -m bench.cache --reps 5

A project shaped like a flodl project (:mod:`bench.flodl_crate` at benchmark
size: torch-sys compiling a C shim against the variant's header, tch over it,
ordinary dependency crates taking most of the compile time, the binary) with
three variants whose headers differ, and three simulated hosts, one per
variant (the rig of :mod:`bench.run`, real sshd). In each repetition, with a
fresh cache and ``target/`` for every cold run:

- 6a: cold ``inv prebuild`` of the 3 variants with the cache vs without;
- 6b: cold ``inv prebuild`` of 1 variant alone (the unit both are compared to);
- 6c: an arch swap on one host (a new arch, so a new slug and target dir) with
  a warm cache vs without;
- 6d: the no-op ``inv prebuild`` (nothing changed) with the cache on vs off.

Targets: 3 variants with the cache <= 1.5x one variant alone; the arch swap
with the cache <= 0.4x a cold build; the no-op unchanged within noise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import flodl_crate
from bench.run import STATE, Bench, BenchError, Comparison, log, median, table
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.interrupts import sigterm_as_interrupt
from rig.harness import builder_settings, rig_worker, write_cluster

VARIANTS = {"precompiled/cu128": 2071, "precompiled/cu126": 2082, "precompiled/cu118": 2063}
SWAPPED = "precompiled/cu126-pt27"  # its own directory, an existing image tag
CACHE = STATE / "sccache"
RESULTS = Path(__file__).resolve().parent / "cache-results.json"


class CacheBench(Bench):
    """The bench's rig, with the flodl-shaped crate and a cache of its own."""

    def up(self) -> None:
        super().up()
        flodl_crate.generate(self.project / "flodl", flodl_crate.BENCH)
        flodl_crate.layout_variants(self.project / "flodl", {**VARIANTS, SWAPPED: 2090})

    def flodl_cluster(self, name: str, archs: Sequence[str]) -> Path:
        root = self.project / "flodl"
        controller: dict[str, Any] = {"path": str(root), "data_path": str(root)}
        if self.docker:
            controller["docker"] = builder_settings(self.owner)
        workers = [
            rig_worker(self.rig, f"b{i + 1:02d}", root, arch=arch) for i, arch in enumerate(archs)
        ]
        return write_cluster(self.work / name, controller, workers)

    def prebuild(self, cluster: Path, cache: bool, fresh: bool) -> float:
        """One ``inv prebuild``; ``fresh``: an empty target tree (and cache) first."""
        if fresh:
            shutil.rmtree(self.project / "flodl" / "target", ignore_errors=True)
            if cache:
                shutil.rmtree(CACHE, ignore_errors=True)
        args = ["prebuild", "--cmd", flodl_crate.COMMAND, "--cluster-file", str(cluster)]
        run = self.inv(*args, *([] if cache else ["--no-cache"]))
        return run.seconds

    def inv_env(self) -> dict[str, str]:
        return {**super().inv_env(), "INVOKE_FDL_COMPILE_CACHE_DIR": str(CACHE)}


def compare(bench: CacheBench) -> list[Comparison]:
    three = bench.flodl_cluster("cache3.yaml", list(VARIANTS))
    one = bench.flodl_cluster("cache1.yaml", list(VARIANTS)[:1])
    swapped = bench.flodl_cluster("swap.yaml", [SWAPPED, *list(VARIANTS)[1:]])
    cold = Comparison("6a", "cold prebuild, 3 variants", "cache", "no cache", "cache/no", "report")
    alone = Comparison("6b", "3 variants vs 1 alone", "3, cache", "1 alone", "3/1", "<= 1.5")
    swap = Comparison("6c", "arch swap, one host", "cache", "cold, no cache", "swap/cold", "<= 0.4")
    noop = Comparison("6d", "no-op prebuild", "cache on", "cache off", "on/off", "~1.0")
    for rep in range(bench.reps):
        with_cache = bench.prebuild(three, cache=True, fresh=True)
        without = bench.prebuild(three, cache=False, fresh=True)
        single = bench.prebuild(one, cache=False, fresh=True)
        cold.record(with_cache, without)
        alone.record(with_cache, single)
        bench.prebuild(three, cache=True, fresh=True)  # a warm cache and target tree
        on = bench.prebuild(three, True, False)
        # Switched off, the build line differs, so cargo runs once: the no-op is the next run.
        switched = bench.prebuild(three, False, False)
        noop.record(on, bench.prebuild(three, False, False))
        swap.record(bench.prebuild(swapped, True, False), single)
        times = f"3 with {with_cache:.1f}s, without {without:.1f}s, 1 alone {single:.1f}s"
        times += f"; cache switched off {switched:.1f}s"
        log(f"cache rep {rep + 1}: {times}")
    for comparison, limit in ((cold, None), (alone, 1.5), (swap, 0.4), (noop, None)):
        comparison.conclude(median(comparison.a) / median(comparison.b), limit, [])
    return [cold, alone, swap, noop]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.cache", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--native", action="store_true", help="native cargo instead of Docker")
    args = parser.parse_args(argv)
    bench = CacheBench(args.reps, docker=not args.native)
    with sigterm_as_interrupt():
        try:
            bench.up()
            results = compare(bench)
        except (BenchError, KeyboardInterrupt) as exc:
            log(f"aborted: {exc or 'interrupted'}")
            return 1
        finally:
            bench.down()
    payload = {"reps": args.reps, "mode": bench.mode, "comparisons": [c.to_json() for c in results]}
    write_atomically(RESULTS, json.dumps(payload, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
