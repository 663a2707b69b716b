"""What freshness by content costs, side by side: a no-op and an edit on a 40+ crate workspace.

Run from the repository root, as root, with dockerd available (and, beside
other rig users, under ``flock /tmp/fdl-rig.lock``)::

    python3 -m bench.freshness --baseline DIR    # DIR: the code before build records
                                                 # (git archive <commit> | tar -x -C DIR)

One run brings up 3 simulated hosts (sshd on 127.0.5.1-3), one per libtorch
variant, and two copies of a flodl-shaped workspace (:mod:`bench.flodl_crate`
with 30 generated path crates and the vendored third-party ones: 40+ crates,
build scripts among them), each built in ``docker run`` mode with no compile
cache. Every ``inv`` is the real entry point; A and B alternate within a
repetition (medians):

- F1 "no-op, builds": nothing changed, ``inv prebuild`` of the 3 variants; its
  builds phase (first build started to the summary) vs the bare no-op
  ``docker run ... cargo build`` of one variant (the line ``inv --dry
  prebuild`` prints): target <= 1.5;
- F1w "no-op, whole run": the same ``inv prebuild`` from start to exit
  (preflight and verification over ssh included) vs that bare no-op; reported;
- F2 "edit": a one-line edit of ``ddp-bench/src/main.rs`` then ``inv
  prebuild`` of the 3 variants, this code vs the baseline code (its own copy
  of the project, the same edit): target <= 1.05 (not slower than before);
- F3 "no-op, baseline": the baseline's no-op vs this code's (whole runs); reported.

The samples and each run's phases go into ``bench/freshness-results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import flodl_crate
from bench.bare import bare, bare_command
from bench.loop import Row, Timed, inv, log, table, when_and_where
from fdl_tasks.core.atomic_files import write_atomically
from rig.harness import RigCluster, builder_settings, start_rig, write_cluster
from rig.sshrig import HostSpec

STATE = Path("/var/tmp/fdl-bench-freshness")
RESULTS = Path(__file__).resolve().parent / "freshness-results.json"
HOSTS = [HostSpec(f"lb{i}", f"127.0.5.{i}") for i in (1, 2, 3)]
VARIANTS = {"precompiled/cu128": 2071, "precompiled/cu126": 2082, "precompiled/cu118": 2063}
SIZE = flodl_crate.Size(deps=30, modules=1, funcs=1, kinds=1, third_party=True)
COMMAND = flodl_crate.COMMAND
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
BUILDS = "builds (first start to last end)"


class Project:
    """One copy of the workspace, its 3-host cluster file, and the code ``inv`` runs."""

    def __init__(self, rig: RigCluster, name: str, code: Path | None) -> None:
        self.rig, self.root = rig, rig.root / name
        flodl_crate.generate(self.root, SIZE)
        flodl_crate.layout_variants(self.root, VARIANTS)
        controller = {"path": str(self.root), "docker": builder_settings(rig.owner)}
        workers = [
            {**rig.worker(host.name, arch=arch), "path": str(self.root)}
            for host, arch in zip(HOSTS, VARIANTS, strict=True)
        ]
        self.cluster = write_cluster(rig.root / f"{name}.yaml", controller, workers)
        self.env = {**ENV, **({"PYTHONPATH": str(code)} if code else {})}
        self.one = write_cluster(rig.root / f"{name}-1.yaml", controller, workers[:1])

    def prebuild(self) -> Timed:
        args = ["prebuild", "--cmd", COMMAND, "--cluster-file", str(self.cluster)]
        return inv(self.rig, *args, env=self.env)

    def edit(self, rev: str) -> None:
        flodl_crate.edit_main(self.root / COMMAND, rev)


def rows(ours: Project, base: Project, reps: int) -> list[Row]:
    noop = Row(
        "F1", "no-op, 40+ crates, 3 variants: builds phase vs 1 bare no-op", "inv", "bare", 1.5
    )
    whole = Row(
        "F1w", "no-op, 40+ crates, 3 variants: whole run vs 1 bare no-op", "inv", "bare", None
    )
    edit = Row(
        "F2", "edit, 40+ crates, 3 variants: this code vs the baseline", "this", "base", 1.05
    )
    base_noop = Row("F3", "no-op, whole run: the baseline vs this code", "base", "this", None)
    bare_argv = bare_command(ours.rig, ours.one, ["--cmd", COMMAND, "--no-cache"], ours.env)
    log("warming both projects (cold builds of 3 variants each)")
    ours.prebuild()
    base.prebuild()
    bare(bare_argv, "fdl-bench-fresh", 0)
    for rep in range(reps):
        run = ours.prebuild()
        bare_s = bare(bare_argv, "fdl-bench-fresh", rep + 1)
        noop.record(run.phases().get(BUILDS, run.seconds), bare_s, run)
        whole.record(run.seconds, bare_s, run)
        base_noop.record(base.prebuild().seconds, run.seconds)
        for project in (ours, base):
            project.edit(f"e{rep}")
        order = (base, ours) if rep % 2 else (ours, base)
        timed = {project.root: project.prebuild() for project in order}
        edit.record(timed[ours.root].seconds, timed[base.root].seconds, timed[ours.root])
        log(
            f"rep {rep + 1}/{reps}: no-op builds {noop.a[-1]:.2f}s (run {whole.a[-1]:.2f}s) vs "
            f"bare {bare_s:.2f}s; edit {edit.a[-1]:.2f}s vs baseline {edit.b[-1]:.2f}s"
        )
    return [noop, whole, edit, base_noop]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.freshness", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--baseline", type=Path, required=True, help="the code before records")
    parser.add_argument("--reps", type=int, default=5, help="repetitions")
    args = parser.parse_args(argv)
    if not (args.baseline / "fdl_tasks").is_dir():
        parser.error(f"--baseline {args.baseline}: no fdl_tasks/ there")
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    with start_rig(STATE, HOSTS, (), docker=True) as rig:
        ours = Project(rig, "project", None)
        base = Project(rig, "baseline-project", args.baseline.resolve())
        found = rows(ours, base, args.reps)
        crates = len(list(ours.root.glob("*/Cargo.toml"))) + len(
            list(ours.root.glob("*/*/Cargo.toml"))
        )
    report = {
        **when_and_where(load),
        "mode": "docker",
        "hosts": len(HOSTS),
        "variants": list(VARIANTS),
        "workspace": {"size": str(SIZE), "crates": crates},
        "baseline": str(args.baseline),
        "reps": args.reps,
        "wall_s": round(time.monotonic() - started, 1),
        "rows": [row.to_json() for row in found],
    }
    write_atomically(RESULTS, json.dumps(report, indent=2) + "\n")
    print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
