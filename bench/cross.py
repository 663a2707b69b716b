"""What a cross build costs (issue 13): the demo's mixed rig beside its x86-only part.

    python3 -m bench.cross            # 3 repetitions, A and B alternating

The demo rig (``python3 -m rig.demo up``: four x86_64 workers on three
libtorch variants and an emulated aarch64 worker on its own) and the
repository's ``cluster.yaml`` (``docker run`` builds, the aarch64 build in the
trixie cross image). A: cold ``inv prebuild`` of the whole rig (4 builds, one
of them cross); B: the same file without the aarch64 worker (3 builds). Each
run starts from an empty ``target/`` and without the compile cache, so that
every build is a cold build; per-build seconds come from the summary table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from rig import demo
from rig.harness import run_inv

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "cross-results.json"
_ROW = re.compile(
    r"^(\S+)\s+(\S+(?: \(\w+\))?)\s+(?:shared by \d+|own)\s+(?:rebuilt|up to date)\s+([\d.]+)\s"
)


def x86_only(work: Path) -> Path:
    """cluster.yaml without its aarch64 worker."""
    data = yaml.safe_load((REPO / "cluster.yaml").read_text())
    data["workers"] = [w for w in data["workers"] if w.get("cpu_arch") != "aarch64"]
    path = work / "cluster-x86.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cold_prebuild(cluster: Path) -> tuple[float, dict[str, float]]:
    """Wall seconds of one cold prebuild, and each build's seconds by arch."""
    shutil.rmtree(demo.PROJECT / "target", ignore_errors=True)
    started = time.monotonic()
    done = run_inv(
        REPO,
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--no-cache",
        "--cluster-file",
        str(cluster),
        env={"INVOKE_FDL_KNOWN_HOSTS": str(demo.DEMO / "known_hosts")},
        timeout=900,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"bench.cross: prebuild failed:\n{done.stderr[-3000:]}")
    builds = {m.group(2): float(m.group(3)) for m in map(_ROW.match, done.stderr.splitlines()) if m}
    return seconds, builds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.cross", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    demo.up()
    work = demo.DEMO / "bench"
    work.mkdir(exist_ok=True)
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"mixed": [], "x86": []}
    try:
        for _ in range(args.reps):
            runs["mixed"].append(cold_prebuild(REPO / "cluster.yaml"))
            runs["x86"].append(cold_prebuild(x86_only(work)))
    finally:
        demo.RIG.down()
    summary = {
        name: {
            "wall_s": statistics.median(wall for wall, _ in samples),
            "builds_s": {
                arch: statistics.median(b[arch] for _, b in samples if arch in b)
                for arch in samples[0][1]
            },
        }
        for name, samples in runs.items()
    }
    RESULTS.write_text(json.dumps({"reps": args.reps, **summary}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
