"""Side-by-side benchmarks of fdl-tasks against what it wraps (issue 7).

Run from the repository root, as root, with dockerd available::

    python3 -m bench.run                 # 5 repetitions (~14 min on an idle 2-core machine)
    python3 -m bench.run --quick         # 3 repetitions (~9 min)
    python3 -m bench.run --reps 7 --only 1,2,4
    python3 -m bench.run --native        # builds with native cargo instead of Docker
    python3 -m bench.run --budget 24     # minutes; comparison 3 (run last) drops
                                         # repetitions that would overrun (default 24)

Run order: 1+2, 4, 5, 3. The machine should be otherwise idle: builds use both
cores, and anything else running (another test suite, other containers) shows
up directly in the build timings (``loadavg_at_start``/``_end`` are recorded).

The script brings everything up itself and tears it down at the end (also on
Ctrl-C or an error):

- 32 simulated hosts, one real ``sshd`` each, on 127.0.1.1-127.0.1.32 port 2222
  (:mod:`rig.sshrig`), state under ``/var/tmp/fdl-bench/rig``;
- a project tree under ``/var/tmp/fdl-bench/project`` (:func:`rig.project.make_project`:
  stub libtorch variants ``precompiled/cu128`` and ``precompiled/cu126``) plus the
  generated benchmark crate ``big-bench`` (:mod:`bench.crate_gen`);
- dockerd and the builder image (:mod:`rig.docker_builder`).

Every ``inv`` run is the real entry point, ``python3 -m invoke ...``, in
``/var/tmp/fdl-bench/work`` (a ``tasks.py`` with ``from fdl_tasks import ns``), in the
environment of :func:`rig.harness.rig_env`: ``FLODL_HOST_NAME=ctrl``,
``INVOKE_FDL_KNOWN_HOSTS`` in the state dir, no ssh config file.

Comparisons (A and B alternate within one run: A, B, A, B, ...; medians):

1. ``inv preflight`` over 16 hosts vs the same probe script run by 16 parallel
   OpenSSH clients (``Rig.ssh_argv``). Ratio fdl/openssh, target <= 1.0.
2. ``inv preflight`` over 16 hosts vs over 1 host. Ratio 16/1 (no target; on 2 cores
   the sshd side of 16 handshakes is most of the cost).
3. cold ``inv prebuild`` (``target/`` deleted first) for 8 hosts on 2 variants, shared
   builds vs ``--per-host``. Ratio shared/per-host, target <= 0.35.
4. cold ``inv prebuild`` for 1 host vs the bare ``docker run ... cargo build`` it
   wraps (taken from ``inv --dry prebuild``), same cold target dir; target <= 1.15.
   Then the same with nothing changed (warm target dir): target <= 2.0.
5. peak RSS of a cold ``inv prebuild`` over 32 hosts on 2 variants, twice
   (``/usr/bin/time -v``: the largest process of the tree; and the ``inv`` process's own
   ``VmHWM``, sampled every 50 ms). Target <= 150 MiB.

The table goes to stdout; everything (samples, medians, per-phase timings taken
from the time each stderr line of ``inv`` arrived, machine facts) goes to
``bench/results.json``. Teardown: ``Rig.down()`` (every sshd it started) and any
build container of the bench's runs still present (normally none: ``--rm``).
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import crate_gen
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.console import format_table
from fdl_tasks.core.interrupts import sigterm_as_interrupt
from fdl_tasks.preflight.probe import ProbeRequest
from fdl_tasks.ssh.answers import END
from rig.harness import (
    Running,
    bring_up,
    builder_settings,
    inv_argv,
    remove_our_containers,
    rig_env,
    rig_worker,
    write_cluster,
    write_tasks_file,
)
from rig.project import libtorch_dir
from rig.sshrig import HostSpec, Rig

STATE = Path("/var/tmp/fdl-bench")
RESULTS = Path(__file__).resolve().parent / "results.json"
PORT = 2222
HOSTS = 32
VARIANTS = ("precompiled/cu128", "precompiled/cu126")
CMD = crate_gen.DEFAULT_NAME
TEARDOWN_S = 30.0
TIME_FILE = STATE / "work" / "time-v.txt"

# ---------------------------------------------------------------------------- helpers


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[bench {stamp}] {message}", flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def host_name(i: int) -> str:
    return f"b{i:02d}"


def host_specs() -> list[HostSpec]:
    return [HostSpec(host_name(i), f"127.0.1.{i}", PORT) for i in range(1, HOSTS + 1)]


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


@dataclass
class Run:
    """One timed subprocess: wall seconds, exit code, stderr lines with arrival times."""

    seconds: float
    returncode: int
    stdout: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    peak_rss_tree_kib: int | None = None
    peak_rss_self_kib: int | None = None

    @property
    def stderr(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def at(self, pattern: str, last: bool = False) -> float | None:
        """Seconds after start at which the first (or last) line matching ``pattern`` came."""
        found = [t for t, text in self.lines if re.search(pattern, text)]
        if not found:
            return None
        return found[-1] if last else found[0]

    def phases(self) -> dict[str, float]:
        """Where an ``inv prebuild``/``preflight`` spent its time, from its stderr lines."""
        marks = [
            ("startup (imports, cluster load)", self.at(r"^preflight: probing")),
            ("preflight (ssh fan-out)", self.at(r"^preflight: \d+ ok")),
            ("lock + tool checks", self.at(r"^prebuild: \d+ build\(s\)")),
            ("builds", self.at(r"^prebuild: \S+ (ok|FAILED)", last=True)),
            ("verification", self.at(r"^verify: ")),
            ("envelope + exit", self.seconds),
        ]
        phases: dict[str, float] = {}
        previous = 0.0
        for name, mark in marks:
            if mark is None:
                continue
            phases[name] = round(mark - previous, 3)
            previous = mark
        return phases


def _vm_hwm_kib(pid: int) -> int | None:
    """The process's peak resident set (``VmHWM``: psutil reports only the current RSS)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _sample_vm_hwm(process: subprocess.Popen[str]) -> list[int]:
    """``VmHWM`` of the process's children every 50 ms until it exits (the inv under time)."""
    samples: list[int] = []
    while process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(process.pid).children():
                value = _vm_hwm_kib(child.pid)
                if value is not None:
                    samples.append(value)
        time.sleep(0.05)
    return samples


def _time_v_peak_kib() -> int | None:
    text = TIME_FILE.read_text() if TIME_FILE.is_file() else ""
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return int(match.group(1)) if match else None


class Runner:
    """Runs subprocesses, timing them, and remembers the live one so teardown can stop it."""

    def __init__(self) -> None:
        self.current: Running | None = None

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 900,
        rss_via_time: bool = False,
    ) -> Run:
        if rss_via_time:
            argv = ["/usr/bin/time", "-v", "-o", str(TIME_FILE), *argv]
        running = Running(argv, cwd, env, stdin=subprocess.DEVNULL)
        self.current = running
        hwm = _sample_vm_hwm(running.process) if rss_via_time else []
        try:
            code = running.finish(timeout)
        except subprocess.TimeoutExpired:
            running.process.kill()
            code = running.finish()
        self.current = None
        result = Run(running.seconds, code, running.stdout, running.lines)
        if rss_via_time:
            result.peak_rss_tree_kib = _time_v_peak_kib()
            result.peak_rss_self_kib = max(hwm) if hwm else None
        return result

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop(timeout=20)


# ---------------------------------------------------------------------------- the bench


@dataclass
class Comparison:
    key: str
    what: str
    a_label: str
    b_label: str
    ratio_label: str
    target: str
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    ratio: float | None = None
    met: bool | None = None
    unit: str = "s"
    notes: list[str] = field(default_factory=list)
    phases_a: dict[str, float] = field(default_factory=dict)
    phases_b: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "what": self.what,
            "a": self.a_label,
            "b": self.b_label,
            "unit": self.unit,
            "a_samples": [round(x, 3) for x in self.a],
            "b_samples": [round(x, 3) for x in self.b],
            "a_median": round(median(self.a), 3) if self.a else None,
            "b_median": round(median(self.b), 3) if self.b else None,
            "ratio_definition": self.ratio_label,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "target": self.target,
            "met": self.met,
            "a_phases_median": self.phases_a,
            "b_phases_median": self.phases_b,
            "notes": self.notes,
        }

    def record(self, a: float, b: float) -> None:
        """One repetition's A and B."""
        self.a.append(a)
        self.b.append(b)

    def conclude(
        self, ratio: float, limit: float | None, runs_a: Sequence[Run], runs_b: Sequence[Run] = ()
    ) -> None:
        """The ratio (or value), whether it is within ``limit``, and the runs' median phases."""
        self.ratio = ratio
        self.met = None if limit is None else ratio <= limit
        self.phases_a = median_phases(runs_a)
        if runs_b:
            self.phases_b = median_phases(runs_b)


def median_phases(runs: Sequence[Run]) -> dict[str, float]:
    names: dict[str, list[float]] = {}
    for run in runs:
        for name, seconds in run.phases().items():
            names.setdefault(name, []).append(seconds)
    return {name: round(median(values), 3) for name, values in names.items()}


class BenchError(RuntimeError):
    pass


class Bench:
    def __init__(self, reps: int, docker: bool, budget_s: float = 1e9) -> None:
        self.reps = reps
        self.deadline = time.monotonic() + budget_s
        self.docker = docker
        self.rig = Rig(STATE / "rig")
        self.project = STATE / "project"
        self.work = STATE / "work"
        self.known_hosts = self.work / "known_hosts"
        self.runner = Runner()
        self.results: list[Comparison] = []
        self.facts: dict[str, Any] = {}
        self._up = False

    @property
    def owner(self) -> str:
        """What labels the bench's build containers (:data:`rig.harness.OWNER_LABEL`)."""
        return str(self.project)

    @property
    def mode(self) -> str:
        return "docker" if self.docker else "native"

    # ---- lifecycle --------------------------------------------------------------------

    def up(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        write_tasks_file(self.work)
        if self.docker:
            log("docker: ensuring dockerd and the builder image")
        log(f"rig: starting {HOSTS} sshd on 127.0.1.1-127.0.1.{HOSTS}:{PORT}")
        self._up = True
        started = time.monotonic()
        shutil.rmtree(self.project, ignore_errors=True)
        bring_up(
            self.rig,
            host_specs(),
            self.project,
            VARIANTS,
            known_hosts=self.known_hosts,
            docker=self.docker,
        )
        log(f"rig and project: up in {time.monotonic() - started:.1f}s")
        crate = crate_gen.generate(self.project / CMD)
        log(f"project: {self.project} with {crate.name} ({crate_gen.DEFAULT_MODULES} modules)")
        seconds = crate_gen.time_cold_build(crate, libtorch_dir(self.project, VARIANTS[0]))
        self.facts["crate"] = {
            "name": CMD,
            "modules": crate_gen.DEFAULT_MODULES,
            "cold_native_release_build_s": round(seconds, 2),
        }
        log(f"crate: cold native `cargo build --release` takes {seconds:.1f}s")

    def down(self) -> None:
        self.runner.stop()
        if not self._up:
            return
        with contextlib.suppress(Exception):
            for line in remove_our_containers(self.owner):
                log(f"teardown: {line}")
        try:
            self.rig.down()
            log("teardown: rig down (every sshd stopped)")
        except Exception as exc:
            log(f"teardown: rig down failed: {exc}")
        self._up = False

    # ---- cluster files and inv ------------------------------------------------------------

    def cluster(self, name: str, count: int, *, docker: bool | None = None) -> Path:
        """cluster.yaml with hosts b01..b<count>, alternating the two variants."""
        controller: dict[str, Any] = {
            "path": str(self.project),
            "arch": VARIANTS[0],
            "data_path": str(self.project),
        }
        if self.docker if docker is None else docker:
            controller["docker"] = builder_settings(self.owner)
        workers = [
            rig_worker(self.rig, host_name(i), self.project, arch=VARIANTS[(i - 1) % len(VARIANTS)])
            for i in range(1, count + 1)
        ]
        return write_cluster(self.work / name, controller, workers)

    def inv_env(self) -> dict[str, str]:
        return rig_env(self.work, self.known_hosts)

    def inv(self, *args: str, check: bool = True, rss: bool = False) -> Run:
        run = self.runner.run(inv_argv(*args), cwd=self.work, env=self.inv_env(), rss_via_time=rss)
        if check and run.returncode != 0:
            raise BenchError(
                f"inv {shlex.join(args)} exited {run.returncode}:\n{run.stderr[-4000:]}"
            )
        return run

    def cold(self) -> None:
        shutil.rmtree(self.project / "target", ignore_errors=True)

    def fits(self, seconds: float) -> bool:
        """Whether another step of about ``seconds`` ends before the budget (teardown kept)."""
        return time.monotonic() + 1.15 * seconds + TEARDOWN_S < self.deadline

    # ---- 1 + 2: probe fan-out ------------------------------------------------------------

    def openssh_fanout(self, count: int) -> float:
        argvs = []
        for i in range(1, count + 1):
            host = host_name(i)
            script = ProbeRequest(str(self.rig.data_path(host)), True, abi=True).script()
            argvs.append(self.rig.ssh_argv(host, script))
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for argv in argvs
        ]
        outputs = [proc.communicate(timeout=60) for proc in procs]
        seconds = time.monotonic() - started
        for proc, (out, err) in zip(procs, outputs, strict=True):
            if proc.returncode != 0 or END not in out:
                raise BenchError(f"ssh probe failed ({proc.returncode}): {err.strip()}")
        return seconds

    def bench_probes(self, want: set[str]) -> None:
        p16 = self.cluster("preflight16.yaml", 16, docker=False)
        p1 = self.cluster("preflight1.yaml", 1, docker=False)
        p32 = self.cluster("preflight32.yaml", HOSTS, docker=False)
        log("probes: warm-up (host keys learnt on first use, page cache)")
        self.inv("preflight", "--cluster-file", str(p32))
        self.openssh_fanout(16)
        fanout = Comparison(
            "1", "probe fan-out, 16 hosts", "inv preflight", "16 x ssh", "fdl/openssh", "<= 1.0"
        )
        scaling = Comparison(
            "2",
            "probe scaling (inv preflight)",
            "16 hosts",
            "1 host",
            "16/1",
            f"report (nproc={os.cpu_count()})",
        )
        runs16, runs1 = self.probe_reps(p16, p1 if "2" in want else None, fanout, scaling)
        fanout.conclude(median(fanout.a) / median(fanout.b), 1.0, runs16)
        fanout.notes.append(
            "inv preflight also probes the controller locally and reads/writes known_hosts; "
            "the ssh clients skip host-key checks (UserKnownHostsFile=/dev/null)"
        )
        if "1" in want:
            self.results.append(fanout)
        if "2" in want:
            scaling.a = list(fanout.a)
            scaling.conclude(median(scaling.a) / median(scaling.b), None, runs16, runs1)
            scaling.notes.append(
                f"nproc={os.cpu_count()}: 16 sshd handshakes (key exchange, auth, fork+exec "
                "of the session shell) compete with the client for 2 cores"
            )
            self.results.append(scaling)
        self.facts["import_floor"] = self.import_floor()

    def probe_reps(
        self, p16: Path, p1: Path | None, fanout: Comparison, scaling: Comparison
    ) -> tuple[list[Run], list[Run]]:
        """Alternating: inv over 16 hosts, 16 ssh clients, inv over 1 host (if ``p1``)."""
        runs16: list[Run] = []
        runs1: list[Run] = []
        for rep in range(self.reps):
            r16 = self.inv("preflight", "--cluster-file", str(p16))
            if "preflight: 17 ok" not in r16.stderr:  # 16 remotes + the controller
                raise BenchError(f"preflight over 16 hosts not all ok:\n{r16.stderr}")
            ssh16 = self.openssh_fanout(16)
            r1 = self.inv("preflight", "--cluster-file", str(p1)) if p1 is not None else None
            runs16.append(r16)
            fanout.record(r16.seconds, ssh16)
            if r1 is not None:
                runs1.append(r1)
                scaling.b.append(r1.seconds)
            log(
                f"probes rep {rep + 1}/{self.reps}: inv16 {r16.seconds:.2f}s  ssh16 {ssh16:.2f}s"
                + (f"  inv1 {r1.seconds:.2f}s" if r1 is not None else "")
            )
        return runs16, runs1

    def import_floor(self) -> dict[str, float]:
        """What a Python start costs before any ssh: ``import fdl_tasks``, ``inv --list``."""
        env = self.inv_env()
        argvs = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import fdl_tasks": [sys.executable, "-c", "import fdl_tasks"],
            "inv --list": inv_argv("--list"),
        }
        samples: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(3):
            for name, argv in argvs.items():
                samples[name].append(self.runner.run(argv, cwd=self.work, env=env).seconds)
        return {name: round(median(values), 3) for name, values in samples.items()}

    # ---- 4: orchestration overhead ---------------------------------------------------

    def bare_command(self, cluster_file: Path) -> str:
        """The exact ``docker run`` (or native cargo) line ``inv --dry prebuild`` prints."""
        dry = self.inv("--dry", "prebuild", "--cmd", CMD, "--cluster-file", str(cluster_file))
        # The build's line, not the probes' (``[host] ssh …``, ``[ctrl] (local) …``).
        lines = [t for _, t in dry.lines if "] docker run " in t or " && exec setsid " in t]
        if len(lines) != 1:
            raise BenchError(f"expected one build line from inv --dry:\n{dry.stderr}")
        command = lines[0].split("] ", 1)[1]
        if self.docker:
            argv = shlex.split(command)
            if argv[:2] != ["docker", "run"]:
                raise BenchError(f"not a docker run line: {command}")
            return shlex.join(argv)
        return command

    def bare(self, command: str, n: int) -> Run:
        if self.docker:  # same command, a name and label of our own for this run
            argv = shlex.split(command)
            argv[argv.index("--name") + 1] = f"fdl-bench-{os.getpid()}-{n}"
            label = argv.index("--label") + 1
            argv[label] = argv[label].split("=", 1)[0] + f"=bench-{os.getpid()}"
            command = shlex.join(argv)
        run = self.runner.run(["/bin/bash", "-c", command], cwd=self.work)
        if run.returncode != 0:
            raise BenchError(f"bare build exited {run.returncode}:\n{run.stderr[-3000:]}")
        return run

    def bench_overhead(self) -> None:
        b1 = self.cluster("build1.yaml", 1)
        command = self.bare_command(b1)
        self.facts["bare_command"] = command
        log("overhead: warm-up (one cold inv prebuild)")
        self.cold()
        self.inv("prebuild", "--cmd", CMD, "--cluster-file", str(b1))
        cold = self.overhead_comparison("4a", "cold build", "<= 1.15")
        noop = self.overhead_comparison("4b", "no-op rebuild", "<= 2.0")
        cold_runs: list[Run] = []
        noop_runs: list[Run] = []
        for rep in range(self.reps):
            cold_run, noop_run = self.overhead_rep(b1, command, rep, cold, noop)
            cold_runs.append(cold_run)
            noop_runs.append(noop_run)
        cold.conclude(median(cold.a) / median(cold.b), 1.15, cold_runs)
        noop.conclude(median(noop.a) / median(noop.b), 2.0, noop_runs)
        self.results += [cold, noop]
        self.facts["cold_bare_build_s"] = round(median(cold.b), 2)

    def overhead_comparison(self, key: str, what: str, target: str) -> Comparison:
        bare = f"bare {'docker run' if self.docker else 'cargo'}"
        return Comparison(
            key, f"overhead, {what}, 1 host ({self.mode})", "inv prebuild", bare, "fdl/bare", target
        )

    def overhead_rep(
        self, b1: Path, command: str, rep: int, cold: Comparison, noop: Comparison
    ) -> tuple[Run, Run]:
        """Cold: inv prebuild, bare build; then no-op: the same again; the two inv runs."""
        self.cold()
        a = self.inv("prebuild", "--cmd", CMD, "--cluster-file", str(b1))
        self.cold()
        b = self.bare(command, rep)
        # target dir now warm (bare build just ran; the inv build uses the same dir)
        na = self.inv("prebuild", "--cmd", CMD, "--cluster-file", str(b1))
        nb = self.bare(command, 1000 + rep)
        if "Compiling" in na.stderr or "Compiling" in nb.stderr:
            noop.notes.append(f"rep {rep + 1}: something was recompiled on a no-op run")
        cold.record(a.seconds, b.seconds)
        noop.record(na.seconds, nb.seconds)
        log(
            f"overhead rep {rep + 1}/{self.reps}: cold inv {a.seconds:.2f}s bare "
            f"{b.seconds:.2f}s | no-op inv {na.seconds:.2f}s bare {nb.seconds:.2f}s"
        )
        return a, na

    # ---- 3: shared builds -------------------------------------------------------------

    def bench_shared(self) -> None:
        b8 = self.cluster("build8.yaml", 8)
        comp = Comparison(
            "3",
            f"cold prebuild, 8 hosts on 2 variants ({self.mode})",
            "shared (default)",
            "--per-host",
            "shared/per-host",
            "<= 0.35",
        )
        runs_a: list[Run] = []
        runs_b: list[Run] = []
        for rep in range(self.reps):
            if rep and not self.fits(comp.a[-1] + comp.b[-1]):
                comp.notes.append(
                    f"stopped after {rep} of {self.reps} repetitions: another would overrun "
                    "the time budget (--budget)"
                )
                log(comp.notes[-1])
                break
            a, b = self.shared_rep(b8, rep, comp)
            runs_a.append(a)
            runs_b.append(b)
        comp.conclude(median(comp.a) / median(comp.b), 0.35, runs_a, runs_b)
        comp.notes.append(
            f"builds run {os.cpu_count()} at a time (fdl.build_jobs=0: one per core); the "
            "ideal ratio is 2/8 = 0.25 plus the fixed preflight/verify cost"
        )
        self.results.append(comp)

    def shared_rep(self, b8: Path, rep: int, comp: Comparison) -> tuple[Run, Run]:
        self.cold()
        a = self.inv("prebuild", "--cmd", CMD, "--cluster-file", str(b8))
        self.cold()
        b = self.inv("prebuild", "--cmd", CMD, "--per-host", "--cluster-file", str(b8))
        builds = (a.stderr.count(f"Compiling {CMD}"), b.stderr.count(f"Compiling {CMD}"))
        if builds != (2, 8):
            comp.notes.append(f"rep {rep + 1}: builds (shared, per-host) = {builds}")
        comp.record(a.seconds, b.seconds)
        log(
            f"shared rep {rep + 1}/{self.reps}: shared {a.seconds:.1f}s (2 builds) "
            f"per-host {b.seconds:.1f}s (8 builds)"
        )
        return a, b

    # ---- 5: memory ----------------------------------------------------------------------

    def bench_memory(self) -> None:
        b32 = self.cluster("build32.yaml", HOSTS)
        comp = Comparison(
            "5",
            f"peak RSS, cold inv prebuild, {HOSTS} hosts on 2 variants",
            "tree max (time -v)",
            "inv process VmHWM",
            "A in MiB",
            "<= 150 MiB",
            unit="MiB",
        )
        runs: list[Run] = []
        for rep in range(2):
            self.cold()
            run = self.inv("prebuild", "--cmd", CMD, "--cluster-file", str(b32), rss=True)
            tree = (run.peak_rss_tree_kib or 0) / 1024
            own = (run.peak_rss_self_kib or 0) / 1024
            comp.record(tree, own)
            runs.append(run)
            log(
                f"memory rep {rep + 1}: {run.seconds:.1f}s, tree max {tree:.1f} MiB, "
                f"inv VmHWM {own:.1f} MiB"
            )
        comp.conclude(median(comp.a), 150, runs)
        comp.notes.append(
            "time -v reports the largest single process among inv and its waited-for "
            "children (docker CLI / cargo); VmHWM is the inv Python process alone"
        )
        self.results.append(comp)


# ---------------------------------------------------------------------------- report


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} {unit}" if unit == "MiB" else f"{value:.2f} s"


def table(results: Sequence[Comparison]) -> str:
    rows = [("#", "what", "A", "A median", "B", "B median", "ratio", "value", "target", "met?")]
    for comp in results:
        value = "-" if comp.ratio is None else f"{comp.ratio:.2f}"
        met = "-" if comp.met is None else ("yes" if comp.met else "NO")
        rows.append(
            (
                comp.key,
                comp.what,
                comp.a_label,
                fmt(median(comp.a) if comp.a else None, comp.unit),
                comp.b_label,
                fmt(median(comp.b) if comp.b else None, comp.unit),
                comp.ratio_label,
                value,
                comp.target,
                met,
            )
        )
    return "\n".join(format_table(rows, rule=True))


def machine_facts(reps: int, quick: bool, docker: bool) -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "reps": reps,
        "quick": quick,
        "build_mode": "docker" if docker else "native",
        "loadavg_at_start": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m bench.run", description=__doc__)
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5, quick 3)")
    parser.add_argument("--quick", action="store_true", help="3 repetitions")
    parser.add_argument("--native", action="store_true", help="native cargo instead of Docker")
    parser.add_argument(
        "--budget",
        type=float,
        default=24.0,
        help="minutes the whole run may take; comparison 3 (run last) drops repetitions "
        "that would overrun it (default 24)",
    )
    parser.add_argument(
        "--only", default="1,2,3,4,5", help="comma-separated comparisons to run (default all)"
    )
    args = parser.parse_args(argv)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 5)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    args.want = set(args.only.split(","))
    return args


def run_comparisons(bench: Bench, want: set[str]) -> int:
    """Every comparison asked for, the rig up around them; 1 if aborted."""
    with sigterm_as_interrupt():
        try:
            bench.up()
            if want & {"1", "2"}:
                bench.bench_probes(want)
            if "4" in want:
                bench.bench_overhead()
            if "5" in want:
                bench.bench_memory()
            if "3" in want:  # the longest: last, so the time budget can trim it
                bench.bench_shared()
        except (BenchError, KeyboardInterrupt) as exc:
            log(f"aborted: {exc or 'interrupted'}")
            return 1
        finally:
            bench.down()
    return 0


def report(facts: dict[str, Any], results: Sequence[Comparison]) -> None:
    """``bench/results.json``, and the table on stdout."""
    payload = {**facts, "comparisons": [c.to_json() for c in results]}
    write_atomically(RESULTS, json.dumps(payload, indent=2) + "\n")
    print()
    print(
        f"fdl-tasks bench: {facts['date']}, nproc={facts['nproc']}, {facts['cpu_model']}, "
        f"reps={facts['reps']}, builds in {facts['build_mode']}, total {facts['total_s']}s"
    )
    if "crate" in facts:
        crate = facts["crate"]
        print(
            f"crate {crate['name']}: {crate['modules']} modules, cold native release build "
            f"{crate['cold_native_release_build_s']}s"
        )
    print(table(results))
    print(f"\nwritten to {RESULTS}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench: run as root (sshd per host, dockerd)", file=sys.stderr)
        return 2
    docker = not args.native
    facts = machine_facts(args.reps, args.quick, docker)
    bench = Bench(args.reps, docker, args.budget * 60)
    started = time.monotonic()
    status = run_comparisons(bench, args.want)
    bench.results.sort(key=lambda comp: comp.key)
    facts.update(bench.facts)
    facts["total_s"] = round(time.monotonic() - started, 1)
    facts["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report(facts, bench.results)
    return status


if __name__ == "__main__":
    sys.exit(main())
