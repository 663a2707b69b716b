"""Warm build containers in the everyday loop, on a 40-odd crate workspace, side by side.

Run from the repository root, as root, with dockerd available, under the rig's
exclusive lock::

    flock -x /work/rig.lock python3 -m bench.warm            # 5 repetitions
    flock -x /work/rig.lock python3 -m bench.warm --reps 7

One run brings up 3 simulated hosts (sshd on 127.0.5.1-3), one per libtorch
variant, and the flodl-shaped workspace of :mod:`bench.flodl_crate` at its
``workspace`` size (28 generated path crates in two chains, torch-sys with its
build script and C shim, tch, the binaries' package, the real third-party crates
with their build scripts). Docker builds in the rig's builder image, the compile
cache on (the default settings), every ``inv`` the real entry point. Rows, A and
B alternating within a repetition (medians):

- W1 edit → published: a one-line edit of ``ddp-bench/src/main.rs``, then
  ``inv prebuild`` of the 3 variants (warm containers: the default) vs the same
  edit in a copy, then the bare incremental ``docker run`` of one variant that
  ``inv --dry prebuild --no-cache`` prints; target <= 2.0;
- W1c the same with ``--no-warm`` (a container per build, as before);
- W2 W1's prebuild vs the 3 variants' bare builds started at once (no target:
  what the builds alone cost on 2 cores);
- W3 no-op: ``inv prebuild`` with nothing changed vs the bare build with nothing
  changed; target <= 1.5;
- W4 watch: in ``inv prebuild --watch`` (warm), the same edit saved, timed to the
  published sources file, vs the bare incremental build; target <= 1.8;
- W4t the same in a ``--watch --timings`` session: save → published less the
  cycle's builds (first start to last end, from its ``--timings`` page), the
  tool's own share (target <= 0.25 s), beside the builds;
- W3f the least a no-op can cost with Invoke and Fabric: a Python process that
  imports them, logs into the 3 hosts at once (Nagle's algorithm off and prompt
  acknowledgements, as the tool's logins have them), makes two round trips on each
  (preflight's and verification's) and exits, vs the bare no-op build;
- W0 and W2w, the floor: after the same edit, one ``docker exec`` of the bare
  build's cargo in a warm container of the copy, and the 3 variants' at once,
  vs the bare ``docker run`` (no tool at all);
- W2c where the floor is, in CPU: the whole machine's CPU seconds (every core)
  while an edit's ``inv prebuild`` runs, and the standbys it parks as it exits
  start, vs while W2w's 3 warm execs run.

Each ``inv prebuild`` is followed by a wait for the standbys it parks (``docker exec
-d`` clients started once it has exited) to have started, as they do while a user
edits: their CPU is in no other measurement (the bare build after it above all).

Results go to ``bench/warm-results.json`` with the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import flodl_crate
from bench.bare import bare, bare_command, bare_commands, bare_together, timed
from bench.loop import Row, Timed, inv, log, table, when_and_where
from bench.run import BenchError
from fdl_tasks.build.parked_standbys import park_dir
from fdl_tasks.build.warm_containers import WARM_JOB_LABEL, WARM_LABEL
from fdl_tasks.config.layout import ENVELOPES_DIR, TIMINGS_DIR, envelope_file
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.publish.envelope import decode
from fdl_tasks.timings.timings_html import page_data
from rig.harness import RigCluster, Running, builder_settings, inv_argv, start_rig, write_cluster
from rig.sshrig import HostSpec

STATE = Path("/var/tmp/fdl-bench-warm")
RESULTS = Path(__file__).resolve().parent / "warm-results.json"
#: Named as bench.loop's (its phase marks read the host names), on addresses of their own.
HOSTS = [HostSpec(f"lb{i}", f"127.0.5.{i}") for i in (1, 2, 3)]
VARIANTS = {"precompiled/cu128": 2071, "precompiled/cu126": 2082, "precompiled/cu118": 2063}
COMMAND = CRATE_DIR = flodl_crate.COMMAND
ENV = {"INVOKE_FDL_COMPILE_CACHE_DIR": str(STATE / "sccache")}


class Setup:
    """The rig's project (``inv`` builds here) and a copy for the bare builds."""

    def __init__(self, rig: RigCluster) -> None:
        self.rig, self.project, self.copy = rig, rig.project, rig.root / "bare-project"
        for root in (self.project, self.copy):
            flodl_crate.generate(root, flodl_crate.WORKSPACE)
            flodl_crate.layout_variants(root, VARIANTS)
        controller = {"path": str(self.project), "docker": builder_settings(rig.owner)}
        workers = []
        for host, arch in zip(HOSTS, VARIANTS, strict=True):
            workers.append({**rig.worker(host.name, arch=arch), "path": str(self.project)})
        self.three = write_cluster(rig.root / "warm3.yaml", controller, workers)
        bare_controller = {**controller, "path": str(self.copy)}
        copies = [{**worker, "path": str(self.copy)} for worker in workers]
        one = write_cluster(rig.root / "bare1.yaml", bare_controller, copies[:1])
        args = ["--cmd", COMMAND, "--crate-dir", CRATE_DIR, "--no-cache"]
        self.bare_argv = bare_command(rig, one, args, ENV)
        three = write_cluster(rig.root / "bare3.yaml", bare_controller, copies)
        self.bare_three = bare_commands(rig, three, args, ENV, count=len(VARIANTS))

        self.bare_three_file = three

    def warm_execs(self) -> list[list[str]]:
        """The 3 bare builds as ``docker exec`` in warm containers of the copy (made by an
        ``inv prebuild --no-cache`` of the copy, so their options are the bare lines')."""
        args = ["prebuild", "--cmd", COMMAND, "--crate-dir", CRATE_DIR, "--no-cache"]
        inv(self.rig, *args, "--cluster-file", str(self.bare_three_file), env=ENV)
        execs = []
        for argv in self.bare_three:
            target = next(a for a in argv if a.startswith("CARGO_TARGET_DIR="))
            job = target.rsplit("/", 1)[1]
            labels = [f"label={WARM_LABEL}={self.copy}", f"label={WARM_JOB_LABEL}={job}"]
            found = subprocess.run(
                ["docker", "ps", "-q", *(x for label in labels for x in ("--filter", label))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            if len(found) != 1:
                raise BenchError(f"no warm container of {job} for the copy")
            execs.append(["docker", "exec", found[0], *argv[argv.index("cargo") :]])
        return execs

    def crates(self) -> int:
        """Packages in the workspace's ``Cargo.lock``: its own and the third-party ones."""
        return (self.project / "Cargo.lock").read_text().count("[[package]]")

    def prebuild(self, *options: str) -> Timed:
        """One ``inv prebuild``, timed to its exit; then the standbys it parks are let
        start (``docker exec -d`` clients it left), as they do while a user edits, so
        that their CPU is in no measurement of the next row (its bare build above all)."""
        args = ["prebuild", "--cmd", COMMAND, "--crate-dir", CRATE_DIR]
        since = time.time()
        timed = inv(self.rig, *args, "--cluster-file", str(self.three), *options, env=ENV)
        settle(self.project, since)
        return timed


def settle(project: Path, since: float) -> None:
    """Until each standby a prebuild of ``project`` parked after ``since`` is waiting (its
    slot says it is ready) and no ``docker exec -d`` client runs: at most 30 s."""
    slots = park_dir(str(project))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        made = [s for s in slots.glob("*/go") if s.stat().st_mtime >= since]
        if all((s.parent / "ready").exists() for s in made) and not detached_execs():
            return
        time.sleep(0.01)


def detached_execs() -> list[int]:
    """The ``docker exec -d`` clients running on this machine."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"exec", b"-d"] and argv[0].endswith(b"docker"):
            found.append(pid)
    return found


def floor_rows(setup: Setup, reps: int) -> list[Row]:
    """W0 and W2w: the builds alone, no tool: one warm exec, and the 3 variants' warm
    execs at once, each after the same edit, vs one bare ``docker run``; W2c: the
    machine's CPU seconds of an edit's prebuild vs the 3 execs'."""
    one = Row("W0", "edit, 1 warm exec vs 1 bare docker run (no tool)", "exec", "bare", None)
    three = Row("W2w", "edit, 3 warm execs at once vs 1 bare (no tool)", "3 execs", "bare", None)
    what = "CPU seconds, all cores: edit → published (W1) vs W2w's 3 warm execs"
    cpu = Row("W2c", what, "inv", "3 execs", None)
    execs = setup.warm_execs()
    bare_together(execs, "unused", 0)
    for rep in range(reps):
        flodl_crate.edit_main(setup.copy / CRATE_DIR, f"x{rep}")
        alone = bare(execs[0], "unused", 0)
        flodl_crate.edit_main(setup.copy / CRATE_DIR, f"y{rep}")
        before = machine_cpu()
        together = bare_together(execs, "unused", 0)
        execs_cpu = machine_cpu() - before
        flodl_crate.edit_main(setup.project / CRATE_DIR, f"c{rep}")
        before = machine_cpu()
        setup.prebuild()
        cpu.record(machine_cpu() - before, execs_cpu)
        flodl_crate.edit_main(setup.copy / CRATE_DIR, f"z{rep}")
        single = bare(setup.bare_argv, "fdl-bench-warm", 200 + rep)
        one.record(alone, single)
        three.record(together, single)
        log(
            f"floor {rep + 1}/{reps}: exec {alone:.2f}s, 3 {together:.2f}s, bare {single:.2f}s; "
            f"CPU s: prebuild {cpu.a[-1]:.2f}, 3 execs {cpu.b[-1]:.2f}"
        )
    return [one, three, cpu]


def machine_cpu() -> float:
    """CPU seconds every core of the machine has spent since boot, idle and I/O wait apart."""
    ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


#: The least a no-op prebuild can be, as a program: Python with Invoke and Fabric, every
#: host's login at once, then two round trips each (preflight's, verification's), exit.
LEAST_CLIENT = """
import socket, sys, threading
import fabric, invoke, paramiko
hosts = sys.argv[2:]
class Acking(socket.socket):  # prompt acknowledgements, as the Fleet's logins have them
    def recv(self, n, flags=0):
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv(n, flags)
def prompt(sock, **options):  # TCP_NODELAY, as the Fleet's logins have it
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    timeout = sock.gettimeout()
    sock = Acking(sock.family, sock.type, sock.proto, fileno=sock.detach())
    sock.settimeout(timeout)
    return paramiko.Transport(sock, **options)
def ask(host):
    c = fabric.Connection(host, user="root", port=2222, connect_kwargs={
        "key_filename": sys.argv[1], "look_for_keys": False, "allow_agent": False,
        "transport_factory": prompt})
    c.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    for _ in range(2):
        c.run("true", hide=True, in_stream=False)
    c.close()
threads = [threading.Thread(target=ask, args=(h,)) for h in hosts]
for t in threads: t.start()
for t in threads: t.join()
"""


def least_client(setup: Setup) -> float:
    """Seconds of one :data:`LEAST_CLIENT` run against the rig's hosts."""
    key = setup.rig.rig.client_key
    argv = [sys.executable, "-c", LEAST_CLIENT, str(key), *(h.address for h in HOSTS)]
    return timed(argv, "the least client")


def loop_rows(setup: Setup, reps: int) -> list[Row]:
    """W1, W1c, W2, W3: edit then prebuild (warm, then not) vs the bare builds."""
    edit = Row("W1", "edit → published, 3 variants, warm vs 1 bare", "inv", "bare", 2.0)
    cold = Row("W1c", "edit → published, 3 variants, --no-warm vs 1 bare", "inv", "bare", None)
    three = Row("W2", "edit → published, 3 variants, warm vs 3 bare at once", "inv", "3 bare", None)
    noop = Row("W3", "no-op, 3 variants, warm vs 1 bare no-op", "inv", "bare", 1.5)
    what = "the least client (Fabric logins, 2 round trips) vs 1 bare no-op"
    least = Row("W3f", what, "least", "bare", None)
    log("warming both target trees and the containers")
    setup.prebuild()
    setup.prebuild("--no-warm")
    bare(setup.bare_argv, "fdl-bench-warm", 0)
    bare_together(setup.bare_three, "fdl-bench-warm3", 0)
    for rep in range(reps):
        for row, options in ((edit, []), (cold, ["--no-warm"])):
            rev = f"{row.key}{rep}"
            flodl_crate.edit_main(setup.project / CRATE_DIR, rev)
            run = setup.prebuild(*options)
            check_published(setup.rig, setup.project, COMMAND, rev)
            flodl_crate.edit_main(setup.copy / CRATE_DIR, rev)
            row.record(run.seconds, bare(setup.bare_argv, "fdl-bench-warm", 10 * rep + 1), run)
            if row is edit:
                flodl_crate.edit_main(setup.copy / CRATE_DIR, f"{rev}-3")
                together = bare_together(setup.bare_three, "fdl-bench-warm3", rep + 1)
                three.record(run.seconds, together, run)
        again = setup.prebuild()
        noop.record(again.seconds, bare(setup.bare_argv, "fdl-bench-warm", 10 * rep + 2), again)
        least.record(least_client(setup), bare(setup.bare_argv, "fdl-bench-warm", 10 * rep + 3))
        log(
            f"rep {rep + 1}/{reps}: edit warm {edit.a[-1]:.2f}s, --no-warm {cold.a[-1]:.2f}s, "
            f"bare {edit.b[-1]:.2f}s, 3 bare {three.b[-1]:.2f}s; no-op {noop.a[-1]:.2f}s vs "
            f"bare {noop.b[-1]:.2f}s"
        )
    return [edit, cold, three, noop, least]


def check_published(rig: RigCluster, project: Path, command: str, rev: str) -> None:
    """Every host's published binary runs there and prints its own variant and the edit."""
    envelopes = decode((project / envelope_file(command)).read_text(), "envelope")
    archs = {h.name: arch for h, arch in zip(HOSTS, VARIANTS, strict=True)}
    for host, entry in sorted(envelopes.items()):
        line = rig.run_on_host(host, str(project), entry)
        wanted = f"{command} variant={archs[host]} shim={VARIANTS[archs[host]]} cuda=on"
        if not line.startswith(wanted) or f"rev={rev}" not in line:
            raise BenchError(f"{host} runs a binary that prints {line!r}")


def published(project: Path) -> int:
    """When the command's sources file was last replaced (it is, at each publication)."""
    try:
        return (project / ENVELOPES_DIR / f"{COMMAND}.sources.json").stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def wait_published(run: Running, project: Path, since: int, timeout: float = 600) -> float:
    """``time.monotonic()`` when the sources file changed after ``since``."""
    deadline = time.monotonic() + timeout
    while published(project) == since:
        if run.process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"nothing published within {timeout:g}s:\n{run.stderr[-4000:]}")
        time.sleep(0.005)
    return time.monotonic()


def last_cycle_builds(project: Path) -> tuple[float, float]:
    """(the cycle's wall seconds, its builds' seconds: first start to last end) from the
    newest ``--timings`` page."""
    pages = sorted((project / TIMINGS_DIR).glob(f"{COMMAND}-*.html"))
    data = page_data(pages[-1].read_text()) if pages else None
    if data is None:
        raise BenchError(f"no timings page under {project / TIMINGS_DIR}")
    builds = [span for span in data["spans"] if span["kind"] == "build"]
    return data["wall"], max(b["end"] for b in builds) - min(b["start"] for b in builds)


def watch_row(setup: Setup, reps: int, timings: bool) -> Row:
    """W4: save → published in a ``--watch`` session vs the bare incremental build; with
    ``timings`` (W4t) the tool's own share instead: save → published less the cycle's
    builds, as its ``--timings`` page draws them, vs the builds."""
    if timings:
        what = "watch, the tool's share (save → published less the builds) vs the builds"
        row = Row("W4t", what, "tool", "builds", None)
    else:
        row = Row("W4", "watch save → published, 3 variants, warm vs 1 bare", "watch", "bare", 1.8)
    argv = ["prebuild", "--cmd", COMMAND, "--crate-dir", CRATE_DIR, "--watch"]
    run = Running(
        inv_argv(*argv, *(["--timings"] if timings else []), "--cluster-file", str(setup.three)),
        setup.rig.root,
        setup.rig.environment(ENV),
    )
    try:
        wait_published(run, setup.project, published(setup.project), 900)
        time.sleep(2.0)  # the first cycle's verification and line, then quiet
        for rep in range(reps):
            rev = f"W4{'t' if timings else ''}{rep}"
            before = published(setup.project)
            saved = time.monotonic()
            flodl_crate.edit_main(setup.project / CRATE_DIR, rev)
            seconds = wait_published(run, setup.project, before) - saved
            time.sleep(1.0)  # the cycle's own last line, then quiet before the bare build
            check_published(setup.rig, setup.project, COMMAND, rev)
            if timings:
                wall, builds = last_cycle_builds(setup.project)
                row.record(seconds - builds, builds)
                log(
                    f"W4t {rep + 1}/{reps}: {seconds:.2f}s, cycle {wall:.2f}s, builds {builds:.2f}s"
                )
                continue
            flodl_crate.edit_main(setup.copy / CRATE_DIR, rev)
            row.record(seconds, bare(setup.bare_argv, "fdl-bench-warm", 100 + rep))
            log(f"W4 rep {rep + 1}/{reps}: published {row.a[-1]:.2f}s, bare {row.b[-1]:.2f}s")
    finally:
        run.stop()
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.warm", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each row")
    groups_help = "row groups: W0 (W0, W2w, W2c), W1 (W1-W3), W4 (W4, W4t)"
    parser.add_argument("--only", default="W0,W1,W4", help=groups_help)
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"default: {RESULTS}")
    args = parser.parse_args(argv)
    groups = {g.strip() for g in args.only.split(",") if g.strip()}
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    rows: list[Row] = []
    with start_rig(STATE, HOSTS, (), docker=True) as rig:
        setup = Setup(rig)
        if "W1" in groups:
            rows += loop_rows(setup, args.reps)
        if "W0" in groups:
            rows += floor_rows(setup, args.reps)
        if "W4" in groups:
            rows.append(watch_row(setup, args.reps, timings=False))
            rows.append(watch_row(setup, args.reps, timings=True))
        for cluster in (setup.three, setup.bare_three_file):  # no warm container left
            inv(rig, "clean", "--cluster-file", str(cluster), env=ENV)
        crates = setup.crates()
    report = {
        **when_and_where(load),
        "mode": "docker, warm build containers (the default) unless --no-warm",
        "hosts": len(HOSTS),
        "variants": list(VARIANTS),
        "crate": {"size": str(flodl_crate.WORKSPACE), "packages": crates},
        "bare_command": shlex.join(setup.bare_argv),
        "reps": args.reps,
        "wall_s": round(time.monotonic() - started, 1),
        "rows": [row.to_json() for row in rows],
    }
    write_atomically(args.out, json.dumps(report, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
