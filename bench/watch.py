"""What ``prebuild --watch`` costs: save-to-published latency beside a bare build.

Run from the repository root, as root, with dockerd available (and, beside
other rig users, under ``flock /tmp/fdl-rig.lock``)::

    python3 -m bench.watch              # 3 repetitions of each comparison
    python3 -m bench.watch --reps 5 --crates small

One run brings up 3 simulated hosts (sshd on 127.0.3.1-3) on 3 libtorch
variants (``precompiled/cu128``, ``precompiled/cu126``, ``precompiled/cpu``),
Docker builds in the rig's builder image, no compile cache. For each crate
(``small``: the rig's ``ddp-bench`` fixture; ``big``: the generated
``big-bench``, :mod:`bench.crate_gen`; ``flodl``: the flodl-shaped workspace of
:mod:`bench.flodl_crate` at its ``loop`` size, real third-party crates and two
binaries, written over the project, so best run alone), A and B alternate:

A. a one-line edit of ``src/main.rs`` in the watched project, timed from the
   write to the arrival of the watcher's ``watch: cycle N ok`` line: 3 builds,
   verification on the 3 hosts over ssh, the envelope published (its binary is
   then run on a host to check it prints the edit);
B. the same edit in a copy of the project, then the bare incremental
   ``docker run ... cargo build`` of one variant that ``inv --dry prebuild``
   prints for it (its own container name), timed around the command.

Both target dirs are warm before the first repetition. Results (samples,
medians, ratio A/B, the cycle's own seconds as the watcher reports them, the
debounce) go to ``bench/watch-results.json``; the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import crate_gen, flodl_crate
from bench.bare import bare, bare_command
from bench.run import BenchError
from fdl_tasks.config.layout import envelope_file
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, builder_settings, inv_argv, start_rig, write_cluster
from rig.project import make_project
from rig.sshrig import HostSpec

STATE = Path("/var/tmp/fdl-bench-watch")
RESULTS = Path(__file__).resolve().parent / "watch-results.json"
HOSTS = [HostSpec(f"wb{i}", f"127.0.3.{i}") for i in (1, 2, 3)]
VARIANTS = ("precompiled/cu128", "precompiled/cu126", "precompiled/cpu")
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
CRATES = {"small": "ddp-bench", "big": crate_gen.DEFAULT_NAME, "flodl": flodl_crate.COMMAND}
#: The flodl crate's stub libtorch ABI of each variant (its build script checks it).
FLODL_ABIS = (2071, 2082, 2063)
_CYCLE = re.compile(r"^watch: cycle (\d+) (ok|FAILED) in ([\d.]+)s")


def log(message: str) -> None:
    print(f"bench.watch: {message}", file=sys.stderr, flush=True)


def cluster(rig: RigCluster, project: Path, name: str, hosts: Sequence[HostSpec]) -> Path:
    workers = [
        rig_worker_at(rig, h.name, project, VARIANTS[i % len(VARIANTS)])
        for i, h in enumerate(hosts)
    ]
    controller = {"path": str(project), "docker": builder_settings(rig.owner)}
    return write_cluster(rig.root / name, controller, workers)


def rig_worker_at(rig: RigCluster, host: str, project: Path, arch: str) -> dict[str, Any]:
    entry = rig.worker(host, arch=arch)
    entry["path"] = str(project)
    return entry


def cycle_at(run: Running, number: int, timeout: float) -> tuple[float, float]:
    """(seconds after the watcher's start, the cycle's own seconds) of cycle ``number``."""
    deadline = time.monotonic() + timeout
    while True:
        for at, line in list(run.lines):
            match = _CYCLE.match(line)
            if match and int(match.group(1)) == number:
                if match.group(2) != "ok":
                    raise BenchError(f"cycle {number} failed:\n{run.stderr[-4000:]}")
                return at, float(match.group(3))
        if run.process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"no cycle {number} within {timeout:g}s:\n{run.stderr[-4000:]}")
        time.sleep(0.02)


def check_published(rig: RigCluster, project: Path, command: str, rev: str) -> None:
    """The published binary of one host prints the edit (outside the timing)."""
    envelopes = decode((project / envelope_file(command)).read_text(), "envelope")
    host, entry = sorted(envelopes.items())[0]
    line = rig.run_on_host(host, str(project), entry)
    if f"rev={rev}" not in line:
        raise BenchError(f"{host} runs a binary that prints {line!r}, not rev={rev}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_crate(rig: RigCluster, key: str, reps: int, debounce: float) -> dict[str, Any]:
    command = CRATES[key]
    watched, copy = rig.project, rig.root / "bare-project"
    shutil.rmtree(copy / "target", ignore_errors=True)
    make_project(copy, VARIANTS)
    if key == "big":
        crate_gen.generate(watched / command)
        crate_gen.generate(copy / command)
    if key == "flodl":
        for root in (watched, copy):
            flodl_crate.generate(root, flodl_crate.LOOP)
            flodl_crate.layout_variants(root, dict(zip(VARIANTS, FLODL_ABIS, strict=True)))
    three = cluster(rig, watched, f"watch-{key}.yaml", HOSTS)
    one = cluster(rig, copy, f"bare-{key}.yaml", HOSTS[:1])
    argv = bare_command(rig, one, ["--cmd", command], ENV)
    log(f"{key}: warming the bare target dir ({command}, {VARIANTS[0]})")
    bare(argv, "fdl-bench-watch", 0)
    log(f"{key}: starting inv prebuild --watch ({len(HOSTS)} hosts, {len(VARIANTS)} variants)")
    run = Running(
        inv_argv(
            "prebuild", "--cmd", command, "--watch", "--no-cache", "--cluster-file", str(three)
        ),
        rig.root,
        rig.environment({**ENV, "INVOKE_FDL_WATCH_DEBOUNCE": str(debounce)}),
    )
    samples: dict[str, list[float]] = {"watch": [], "watch_cycle": [], "bare": []}
    try:
        _, first = cycle_at(run, 1, 900)
        log(f"{key}: first cycle (full prebuild) {first:.1f}s")
        for rep in range(reps):
            rev = f"{key}{rep}"
            saved = time.monotonic() - run.started
            flodl_crate.edit_main(watched / command, rev)
            at, own = cycle_at(run, rep + 2, 600)
            samples["watch"].append(round(at - saved, 3))
            samples["watch_cycle"].append(own)
            check_published(rig, watched, command, rev)
            time.sleep(1.0)  # let the watcher settle before the bare build takes the cores
            flodl_crate.edit_main(copy / command, rev)
            samples["bare"].append(round(bare(argv, "fdl-bench-watch", rep + 1), 3))
            log(
                f"{key} rep {rep + 1}/{reps}: save-to-published {samples['watch'][-1]:.2f}s "
                f"(cycle {own:.1f}s) | bare docker run {samples['bare'][-1]:.2f}s"
            )
    finally:
        run.stop()
    return {"crate": command, "bare_command": shlex.join(argv), **summary(samples)}


def summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians and ratios: A/B, and A against B once per variant (3 builds share 2 cores)."""
    watch_median, bare_median = median(samples["watch"]), median(samples["bare"])
    return {
        "samples": samples,
        "watch_median_s": round(watch_median, 3),
        "watch_cycle_median_s": round(median(samples["watch_cycle"]), 3),
        "bare_median_s": round(bare_median, 3),
        "ratio_watch_over_bare": round(watch_median / bare_median, 3),
        "ratio_watch_over_bare_per_variant": round(watch_median / (len(VARIANTS) * bare_median), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.watch", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--crates", default="small,big", help="small, big, flodl (alone)")
    parser.add_argument("--debounce", type=float, default=0.3, help="fdl.watch_debounce")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.crates.split(",") if k.strip()]
    if not keys or any(k not in CRATES for k in keys):
        parser.error(f"--crates: a comma-separated list of {', '.join(CRATES)}")
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    results: dict[str, Any] = {}
    load = os.getloadavg()[0]
    with start_rig(STATE, HOSTS, VARIANTS, docker=True) as rig:
        for key in keys:
            results[key] = bench_crate(rig, key, args.reps, args.debounce)
    report = {
        "reps": args.reps,
        "mode": "docker",
        "hosts": len(HOSTS),
        "variants": list(VARIANTS),
        "debounce_s": args.debounce,
        "compile_cache": False,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": round(load, 2),
            "loadavg_at_end": round(os.getloadavg()[0], 2),
        },
        "crates": results,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{'crate':8} {'save-to-published (3 variants)':>32} {'bare docker run (1)':>20} "
        "ratio  ratio/variant"
    )
    for key, r in results.items():
        print(
            f"{key:8} {r['watch_median_s']:>31.2f}s {r['bare_median_s']:>19.2f}s "
            f"{r['ratio_watch_over_bare']:>5.2f}  {r['ratio_watch_over_bare_per_variant']:>13.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
