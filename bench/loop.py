"""The everyday loop, side by side: a second command, an edit, nothing changed.

Run from the repository root, as root, with dockerd available (and, beside
other rig users, under ``flock /tmp/fdl-rig.lock``)::

    python3 -m bench.loop               # 3 repetitions of the cold rows, 5 of the loop rows
    python3 -m bench.loop --reps 3 --loop-reps 7

One run brings up 3 simulated hosts (sshd on 127.0.4.1-3), one per libtorch
variant (``precompiled/cu128``, ``cu126``, ``cu118``, headers of different
ABIs), and a flodl-shaped project (:mod:`bench.flodl_crate` at its ``loop``
size: torch-sys with its C shim, tch, two generated crates, and real
third-party crates from Debian's packages: serde with derive, serde_json,
regex and what they pull in, 13 crates; the ``ddp-bench`` package has two
binaries, ``ddp-bench`` and ``ddp-eval``). Docker builds in the rig's
builder image, every ``inv`` the real entry point. Rows (A and B alternate
within a repetition; medians):

- L1 "second command after the first", no compile cache: from an empty
  ``target/``, ``inv prebuild --cmd ddp-bench`` (A0), then ``inv prebuild
  --cmd ddp-eval`` (A1) on the same 3 variants: ratio A1/A0, target <= 0.25
  (every command of a build environment shares its one target dir, so the
  second command compiles only its own binary);
- L4 the number of cargo target dirs under ``target/cluster/`` after those
  two commands: 3 (one per build environment, not per command);
- L2 "edit loop": a one-line edit of ``ddp-bench/src/main.rs`` then ``inv
  prebuild`` of the 3 variants (preflight, 3 builds, verification over ssh,
  publication) vs the same edit in a copy of the project then the bare
  incremental ``docker run ... cargo build`` of one variant that ``inv --dry
  prebuild`` prints for a one-host cluster: target <= 2.2 (on 2 cores 3
  incremental builds cannot take less than about 1.5x one);
- L3 "no-op": the same two with nothing changed: target <= 2.5;
- L2t "three bare builds": after the same edit, the three variants' bare
  lines (``inv --dry prebuild`` of a 3-host cluster) started at once vs one
  alone; reported, no target: what L2's builds phase would cost with no tool;
- L5 "dependency change": :mod:`bench.depchange` (3 variants vs 1, target <= 1.5).

L2 and L3 are taken twice: with the default settings (the compile cache on,
``L2``/``L3``) and with ``--no-cache`` (``L2n``/``L3n``: the same target dirs
as L1). Each ``inv`` run's phases (from the time each of its stderr lines
arrived) go into ``bench/loop-results.json`` beside the samples, with the
machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import flodl_crate
from bench.bare import bare, bare_command, bare_commands, bare_together
from bench.depchange import dependency_changes
from bench.run import BenchError
from fdl_tasks.config.layout import MARKER_FILE, envelope_file
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, builder_settings, inv_argv, start_rig, write_cluster
from rig.sshrig import HostSpec

STATE = Path("/var/tmp/fdl-bench-loop")
RESULTS = Path(__file__).resolve().parent / "loop-results.json"
HOSTS = [HostSpec(f"lb{i}", f"127.0.4.{i}") for i in (1, 2, 3)]
VARIANTS = {"precompiled/cu128": 2071, "precompiled/cu126": 2082, "precompiled/cu118": 2063}
FIRST, SECOND = flodl_crate.COMMAND, flodl_crate.SECOND_COMMAND
CRATE_DIR = flodl_crate.COMMAND
NO_CACHE = ["--no-cache"]
#: Every ``inv`` run's own settings: a compile cache of the bench's own.
ENV = {"INVOKE_FDL_COMPILE_CACHE_DIR": str(STATE / "sccache")}


def log(message: str) -> None:
    print(f"bench.loop {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def when_and_where(load: float) -> dict[str, Any]:
    """A report's date and machine (``load``: the load average when the run started)."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "loadavg_at_start": round(load, 2),
            "loadavg_at_end": round(os.getloadavg()[0], 2),
        },
    }


# ---------------------------------------------------------------------------- one run


class Timed:
    """One ``inv`` run to its end: wall seconds and its stderr lines with arrival times."""

    def __init__(self, running: Running, seconds: float, code: int) -> None:
        self.seconds, self.code = seconds, code
        self.lines: list[tuple[float, str]] = list(running.lines)
        self.stderr = running.stderr

    def at(self, pattern: str, last: bool = False) -> float | None:
        found = [t for t, text in self.lines if re.search(pattern, text)]
        return (found[-1] if last else found[0]) if found else None

    def phases(self) -> dict[str, float]:
        """Seconds per phase, from the first stderr line of each (what ``inv`` says)."""
        marks = [
            ("start (interpreter, imports, cluster file)", self.at(r"^preflight: ")),
            ("preflight (ssh probe, docker checks)", self.at(r"^preflight: \d+ ok")),
            ("lock, cache, container starts", self.at(r"^prebuild: \d+ build\(s\)")),
            ("builds (first start to last end)", self.at(r"^\s*lb\d .*(rebuilt|up to date)", True)),
            ("verification (ssh)", self.at(r"^verify: ")),
            ("publication, exit", self.seconds),
        ]
        phases: dict[str, float] = {}
        previous = 0.0
        for name, mark in marks:
            if mark is not None:
                phases[name] = round(mark - previous, 3)
                previous = mark
        return phases


def inv(rig: RigCluster, *args: str, env: dict[str, str] | None = None) -> Timed:
    environment = rig.environment(env or ENV)
    running = Running(inv_argv(*args), rig.root, environment, stdin=subprocess.DEVNULL)
    code = running.finish(900)
    timed = Timed(running, running.seconds, code)
    if code != 0:
        raise BenchError(f"inv {shlex.join(args)} exited {code}:\n{timed.stderr[-4000:]}")
    return timed


def prebuild(rig: RigCluster, cluster: Path, command: str, *options: str) -> Timed:
    args = ["prebuild", "--cmd", command, "--crate-dir", CRATE_DIR, "--cluster-file", str(cluster)]
    return inv(rig, *args, *options)


def check_published(rig: RigCluster, project: Path, command: str, rev: str | None) -> None:
    """Every host's published binary runs there and prints its own variant (and the edit)."""
    envelopes = decode((project / envelope_file(command)).read_text(), "envelope")
    workers = {h.name: arch for h, arch in zip(HOSTS, VARIANTS, strict=True)}
    for host, entry in sorted(envelopes.items()):
        line = rig.run_on_host(host, str(project), entry)
        wanted = f"{command} variant={workers[host]} shim={VARIANTS[workers[host]]} cuda=on"
        if not line.startswith(wanted) or (rev and f"rev={rev}" not in line):
            raise BenchError(f"{host} runs a binary that prints {line!r}")


def target_dirs(project: Path) -> list[str]:
    """Every cargo target dir prebuild made under ``target/cluster/`` (each has a marker)."""
    cluster = project / "target" / "cluster"
    return sorted(str(m.parent.relative_to(cluster)) for m in cluster.rglob(MARKER_FILE))


# ---------------------------------------------------------------------------- the rows


class Row:
    def __init__(self, key: str, what: str, a: str, b: str, target: float | None) -> None:
        self.key, self.what, self.a_label, self.b_label, self.target = key, what, a, b, target
        self.a: list[float] = []
        self.b: list[float] = []
        self.runs: list[Timed] = []

    def record(self, a: float, b: float, run: Timed | None = None) -> None:
        self.a.append(round(a, 3))
        self.b.append(round(b, 3))
        if run is not None:
            self.runs.append(run)

    @property
    def ratio(self) -> float:
        return median(self.a) / median(self.b)

    def phases(self) -> dict[str, float]:
        names: dict[str, list[float]] = {}
        for run in self.runs:
            for name, seconds in run.phases().items():
                names.setdefault(name, []).append(seconds)
        return {name: round(median(v), 3) for name, v in names.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "what": self.what,
            "a": self.a_label,
            "b": self.b_label,
            "a_samples": self.a,
            "b_samples": self.b,
            "a_median": round(median(self.a), 3),
            "b_median": round(median(self.b), 3),
            "ratio": round(self.ratio, 3),
            "target": None if self.target is None else f"<= {self.target}",
            "met": (set(self.a) == set(self.b))
            if self.key == "L4"
            else None
            if self.target is None
            else self.ratio <= self.target,
            "a_phases_median": self.phases(),
        }


class Setup:
    """The rig's project (``inv`` builds here) and a copy for the bare builds."""

    def __init__(self, rig: RigCluster) -> None:
        self.rig = rig
        self.project = rig.project
        self.copy = rig.root / "bare-project"
        for root in (self.project, self.copy):
            flodl_crate.generate(root, flodl_crate.LOOP)
            flodl_crate.layout_variants(root, VARIANTS)
        controller = {"path": str(self.project), "docker": builder_settings(rig.owner)}
        workers = []
        for host, arch in zip(HOSTS, VARIANTS, strict=True):
            entry = rig.worker(host.name, arch=arch)
            entry["path"] = str(self.project)
            workers.append(entry)
        self.three = write_cluster(rig.root / "loop3.yaml", controller, workers)
        one = {**workers[0], "path": str(self.copy)}
        bare_controller = {**controller, "path": str(self.copy)}
        self.one = write_cluster(rig.root / "bare1.yaml", bare_controller, [one])
        args = ["--cmd", FIRST, "--crate-dir", CRATE_DIR, *NO_CACHE]
        self.bare_argv = bare_command(rig, self.one, args, ENV)
        copies = [{**worker, "path": str(self.copy)} for worker in workers]
        bare_three = write_cluster(rig.root / "bare3.yaml", bare_controller, copies)
        self.bare_three = bare_commands(rig, bare_three, args, ENV, count=len(VARIANTS))


def second_command(setup: Setup, reps: int) -> tuple[Row, Row]:
    """L1 and L4: from an empty target tree, two commands on the 3 variants, no cache."""
    row = Row("L1", "second command after the first, 3 variants, no cache", SECOND, FIRST, 0.25)
    dirs = Row("L4", "cargo target dirs after two commands on 3 variants", "dirs", "wanted", None)
    for rep in range(reps):
        shutil.rmtree(setup.project / "target", ignore_errors=True)
        first = prebuild(setup.rig, setup.three, FIRST, *NO_CACHE)
        second = prebuild(setup.rig, setup.three, SECOND, *NO_CACHE)
        check_published(setup.rig, setup.project, SECOND, None)
        found = target_dirs(setup.project)
        row.record(second.seconds, first.seconds, second)
        dirs.record(len(found), len(VARIANTS))
        log(
            f"L1 rep {rep + 1}/{reps}: first {first.seconds:.1f}s, second "
            f"{second.seconds:.1f}s, target dirs {found}"
        )
    return row, dirs


def loop_rows(setup: Setup, reps: int, options: list[str], suffix: str) -> tuple[Row, Row]:
    """L2 and L3 with ``options``: edit then prebuild vs edit then the bare build; both
    again with nothing changed."""
    mode = "no cache" if options else "default settings (compile cache on)"
    edit_row = Row(
        f"L2{suffix}", f"edit loop, 3 variants vs 1 bare build, {mode}", "inv", "bare", 2.2
    )
    noop_row = Row(f"L3{suffix}", f"no-op, 3 variants vs 1 bare build, {mode}", "inv", "bare", 2.5)
    rig = setup.rig
    log(f"L2{suffix}: warming both target trees ({mode})")
    prebuild(rig, setup.three, FIRST, *options)
    bare(setup.bare_argv, "fdl-bench-loop", 0)
    for rep in range(reps):
        rev = f"{suffix or 'c'}{rep}"
        flodl_crate.edit_main(setup.project / CRATE_DIR, rev)
        run = prebuild(rig, setup.three, FIRST, *options)
        check_published(rig, setup.project, FIRST, rev)
        flodl_crate.edit_main(setup.copy / CRATE_DIR, rev)
        edit_row.record(run.seconds, bare(setup.bare_argv, "fdl-bench-loop", 2 * rep + 1), run)
        noop = prebuild(rig, setup.three, FIRST, *options)
        noop_row.record(noop.seconds, bare(setup.bare_argv, "fdl-bench-loop", 2 * rep + 2), noop)
        log(
            f"L2{suffix} rep {rep + 1}/{reps}: edit {edit_row.a[-1]:.2f}s vs bare "
            f"{edit_row.b[-1]:.2f}s; no-op {noop_row.a[-1]:.2f}s vs bare {noop_row.b[-1]:.2f}s"
        )
    return edit_row, noop_row


def together_row(setup: Setup, reps: int) -> Row:
    """L2t: after the same edit, the 3 variants' bare builds started at once vs 1 alone.

    What 3 incremental builds cost on this machine with no tool at all: the
    floor of L2n's builds phase.
    """
    what = "edit, then the 3 variants' bare builds at once vs 1 bare build, no cache"
    row = Row("L2t", what, "3 at once", "1 alone", None)
    log("L2t: warming the bare target trees")
    bare_together(setup.bare_three, "fdl-bench-three", 0)
    for rep in range(reps):
        flodl_crate.edit_main(setup.copy / CRATE_DIR, f"t{rep}")
        three = bare_together(setup.bare_three, "fdl-bench-three", rep + 1)
        flodl_crate.edit_main(setup.copy / CRATE_DIR, f"t{rep}-one")
        row.record(three, bare(setup.bare_argv, "fdl-bench-loop", 100 + rep))
        log(f"L2t rep {rep + 1}/{reps}: 3 at once {row.a[-1]:.2f}s vs 1 alone {row.b[-1]:.2f}s")
    return row


def dependency_row(setup: Setup, reps: int) -> Row:
    """L5: a dependency change, 3 variants vs 1 (:mod:`bench.depchange`), cache on."""
    what = "dependency change, 3 variants in existing target dirs vs 1 variant, cache on"
    row = Row("L5", what, "3 variants", "1 variant", 1.5)
    own_cache = {"INVOKE_FDL_COMPILE_CACHE_DIR": str(STATE / "sccache-one")}
    one = ["prebuild", "--cmd", FIRST, "--crate-dir", CRATE_DIR, "--cluster-file", str(setup.one)]
    samples = dependency_changes(
        [setup.project / CRATE_DIR, setup.copy / CRATE_DIR],
        reps,
        lambda: prebuild(setup.rig, setup.three, FIRST),
        lambda: inv(setup.rig, *one, env=own_cache),
        log,
    )
    for three, single in samples:
        row.record(three.seconds, single.seconds, three)
    return row


def table(rows: Sequence[Row]) -> str:
    lines = ["| # | comparison | A | B | ratio | target | met |", "| --- " * 7 + "|"]
    for row in rows:
        if row.key == "L4":
            a, b, ratio = f"{median(row.a):.0f}", f"{median(row.b):.0f}", "-"
        else:
            a, b, ratio = f"{median(row.a):.2f} s", f"{median(row.b):.2f} s", f"{row.ratio:.2f}"
        target = "report" if row.target is None else f"<= {row.target}"
        met = "-" if row.target is None else ("yes" if row.ratio <= row.target else "**no**")
        if row.key == "L4":
            target, met = "3", "yes" if set(row.a) == {3} else "**no**"
        lines.append(f"| {row.key} | {row.what} | {a} | {b} | {ratio} | {target} | {met} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.loop", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--reps", type=int, default=3, help="repetitions of L1 (cold builds)")
    parser.add_argument("--loop-reps", type=int, default=5, help="repetitions of L2/L3")
    parser.add_argument(
        "--only", default="L1,L2,L2n,L2t,L5", help="row groups: L1, L2, L2n, L2t, L5"
    )
    args = parser.parse_args(argv)
    groups = {g.strip() for g in args.only.split(",") if g.strip()}
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    rows: list[Row] = []
    with start_rig(STATE, HOSTS, (), docker=True) as rig:
        setup = Setup(rig)
        if "L1" in groups:
            rows += second_command(setup, args.reps)
        if "L2n" in groups:
            rows += loop_rows(setup, args.loop_reps, NO_CACHE, "n")
        if "L2" in groups:
            rows += loop_rows(setup, args.loop_reps, [], "")
        if "L2t" in groups:
            rows.append(together_row(setup, args.loop_reps))
        if "L5" in groups:
            rows.append(dependency_row(setup, args.loop_reps))
    report = {
        **when_and_where(load),
        "mode": "docker",
        "hosts": len(HOSTS),
        "variants": list(VARIANTS),
        "crate": {
            "size": str(flodl_crate.LOOP),
            "third_party": sorted(flodl_crate.THIRD_PARTY),
            "vendored_crates": sorted(p.name for p in (setup.project / "vendor").iterdir()),
            "commands": [FIRST, SECOND],
        },
        "bare_command": shlex.join(setup.bare_argv),
        "reps": {"L1": args.reps, "loop": args.loop_reps},
        "wall_s": round(time.monotonic() - started, 1),
        "rows": [row.to_json() for row in rows],
    }
    write_atomically(RESULTS, json.dumps(report, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
