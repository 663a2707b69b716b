"""Everyday use through the real ``inv``: two commands, clean, the summary, typos, labels.

The fixture package has two binaries, ``ddp-bench`` and ``ddp-eval``, both linking
the workspace's ``fixture-util`` library: a second command built in an
environment's shared target dir compiles only what it adds, which cargo's own
``Compiling`` lines show.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.publish.envelope import PerHostEnvelope, decode
from rig.harness import OWNER_LABEL, RigCluster, Running, containers, inv_argv, start_rig
from rig.project import FIXTURE_DIR
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("e1", "127.0.0.180"),
    HostSpec("e2", "127.0.0.181"),
    HostSpec("e3", "127.0.0.182"),
]
ARCHS = {"e1": "precompiled/cu128", "e2": "precompiled/cu126", "e3": "precompiled/cpu"}
#: The arch e2 is swapped to.
SWAPPED = "precompiled/cu118"
COMMANDS = ("ddp-bench", "ddp-eval")
#: Builds run side by side, and no sccache server outlives a test.
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
SUMMARY = ["host", "arch", "build", "result", "seconds", "binary", "cache"]
MAIN_RS = "ddp-bench/src/main.rs"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = [*ARCHS.values(), SWAPPED]
    with start_rig(tmp_path_factory.mktemp("everyday"), HOSTS, variants, docker=True) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def fresh(rig: RigCluster) -> Iterator[None]:
    """Every host up, the fixture's own sources, no target tree."""
    for host in HOSTS:
        rig.rig.start_host(host.name)
    shutil.copyfile(FIXTURE_DIR / MAIN_RS, rig.project / MAIN_RS)
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    yield
    Running.stop_all()


# ---------------------------------------------------------------------------- helpers


def cluster(rig: RigCluster, name: str, archs: dict[str, str] | None = None, **ctrl: Any) -> Path:
    workers = [rig.worker(host, arch=arch) for host, arch in (archs or ARCHS).items()]
    return rig.write(workers, name, **ctrl)


def docker_cluster(rig: RigCluster, name: str) -> Path:
    return cluster(rig, name, docker=rig.docker_settings())


def inv(rig: RigCluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return rig.inv(*args, env={**ENV, **env})


def prebuild(
    rig: RigCluster, path: Path, command: str = "ddp-bench", *options: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """A successful ``inv prebuild --json``."""
    done = inv(
        rig, "prebuild", "--cmd", command, "--json", *options, "--cluster-file", str(path), **env
    )
    assert done.returncode == 0, done.stderr
    return done


def envelope_path(rig: RigCluster, command: str) -> Path:
    return rig.project / f"target/cluster/_envelopes/{command}.json"


def published(rig: RigCluster, command: str) -> dict[str, PerHostEnvelope]:
    path = envelope_path(rig, command)
    return decode(path.read_text(), str(path))


def compiled(stderr: str, package: str) -> int:
    """How many times cargo said it compiled ``package`` (its own ``Compiling`` lines)."""
    return len(re.findall(rf"\bCompiling {re.escape(package)} v0\.1\.0 \(", stderr))


def summary(stderr: str, hosts: list[str]) -> dict[str, dict[str, str]]:
    """host → its row of the final table (cells are 2+ spaces apart)."""
    rows = [re.split(r" {2,}", line.strip()) for line in stderr.splitlines()]
    assert SUMMARY in rows, stderr
    body = rows[rows.index(SUMMARY) + 1 :]
    table = {r[0]: dict(zip(SUMMARY, r, strict=True)) for r in body if len(r) == len(SUMMARY)}
    table = {host: row for host, row in table.items() if host in hosts}
    assert sorted(table) == sorted(hosts), stderr
    return table


def cuda(arch: str) -> str:
    return "off" if arch.endswith("cpu") else "on"


def expected_line(command: str, arch: str) -> str:
    return f"{command} variant={arch} cuda={cuda(arch)}"


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` (links not followed): mode, size, mtime."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            info = path.lstat()
            found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def shared_dirs(rig: RigCluster) -> list[Path]:
    shared = rig.project / "target/cluster/_shared"
    return sorted(p for p in shared.iterdir()) if shared.is_dir() else []


def docker_calls(rig: RigCluster, name: str) -> tuple[dict[str, str], Path]:
    """A ``PATH`` whose ``docker`` writes its arguments to a file, then runs the real one."""
    shims = rig.root / f"{name}-bin"
    shims.mkdir(exist_ok=True)
    calls = rig.root / f"{name}-docker-calls"
    calls.write_text("")
    real = shutil.which("docker")
    (shims / "docker").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    (shims / "docker").chmod(0o755)
    return {"PATH": f"{shims}:{os.environ['PATH']}"}, calls


def containers_run(calls: Path) -> int:
    """Builds started with the ``docker`` client: each a ``docker run --rm``, or a ``docker
    exec`` in a warm container (not the ``docker run -d`` that starts one, nor the ``docker
    exec -d`` that parks a standby for the next run's build, which starts none)."""
    lines = calls.read_text().splitlines()
    started = (line for line in lines if not line.startswith("exec -d "))
    return sum(1 for line in started if line.startswith(("run --rm ", "exec ")))


def cargo_ran(stderr: str) -> int:
    """Builds of a prebuild of :data:`ARCHS` that ran cargo (in a container, a warm one's
    ``docker exec``, or a standby the last run parked): the others say they did not."""
    return len(ARCHS) - stderr.count("cargo not started")


def marker_arch(directory: Path) -> str:
    return str(json.loads((directory / ".fdl-build.json").read_text())["arch"])


# ---------------------------------------------------------------------------- 1. two commands


def test_a_second_command_reuses_each_environments_target_dir(rig: RigCluster) -> None:
    path = docker_cluster(rig, "two.yaml")
    never = inv(rig, "launch", "--cmd", "ddp-eval", "--cluster-file", str(path))
    assert never.returncode == 1
    *said, last = never.stderr.splitlines()
    assert last == (
        f"fdl: 'ddp-eval' has no published envelope ({envelope_path(rig, 'ddp-eval')} does "
        "not exist): run inv prebuild --cmd ddp-eval first"
    )
    assert all(line.startswith("launch: note: the controller's name") for line in said), said

    bench = prebuild(rig, path, "ddp-bench")
    assert compiled(bench.stderr, "fixture-util") == 3, bench.stderr  # once per variant
    first_dirs = shared_dirs(rig)
    assert len(first_dirs) == 3, first_dirs
    assert sorted(marker_arch(d) for d in first_dirs) == sorted(ARCHS.values())
    for directory in first_dirs:
        slug = marker_arch(directory).replace("/", "-")
        assert re.fullmatch(rf"{re.escape(slug)}-[0-9a-f]{{10}}", directory.name), directory

    evaluation = prebuild(rig, path, "ddp-eval")
    # The library and the build script were built for ddp-bench in the same dirs:
    # cargo compiles the new binary only.
    assert compiled(evaluation.stderr, "fixture-util") == 0, evaluation.stderr
    assert compiled(evaluation.stderr, "ddp-bench") == 3, evaluation.stderr  # the bin target
    assert shared_dirs(rig) == first_dirs  # one target dir per variant, whatever the command
    for directory in first_dirs:
        for command in COMMANDS:
            assert (directory / "release" / command).is_file()
            assert (directory / f"build-{command}.log").is_file()

    for command, done in (("ddp-bench", bench), ("ddp-eval", evaluation)):
        assert envelope_path(rig, command).read_text() == done.stdout  # what --json printed
        envelopes = published(rig, command)
        assert sorted(envelopes) == sorted(ARCHS)
        for host, arch in ARCHS.items():
            entry = envelopes[host]
            slug = arch.replace("/", "-")
            assert entry.bin == f"target/cluster/{host}/{slug}/release/{command}"
            assert entry.ld_library_path == f"{rig.project}/libtorch/{arch}/lib"
            # --crate-dir's default: <cmd>/ when it holds a Cargo.toml, else the root.
            assert entry.cwd_subpath == ("ddp-bench" if command == "ddp-bench" else "")
            assert rig.run_on_host(host, str(rig.project), entry) == expected_line(command, arch)

    for command in COMMANDS:
        other = next(c for c in COMMANDS if c != command)
        launched = inv(rig, "launch", "--cmd", command, "--cluster-file", str(path))
        assert launched.returncode == 0, launched.stderr
        for host, arch in ARCHS.items():
            assert f"[{host}] {expected_line(command, arch)}" in launched.stdout
        assert other not in launched.stdout

    # A variable left by a prebuild of the other command does not redirect a launch.
    eval_text = envelope_path(rig, "ddp-eval").read_text().strip()
    launched = inv(
        rig,
        "launch",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        FLODL_INTERNAL_PREBUILD_PER_HOST=eval_text,
    )
    assert launched.returncode == 0, launched.stderr
    for host, arch in ARCHS.items():
        assert f"[{host}] {expected_line('ddp-bench', arch)}" in launched.stdout
    assert "ddp-eval" not in launched.stdout


# ---------------------------------------------------------------------------- 2. clean


def stale_after_swap(rig: RigCluster) -> tuple[Path, list[str]]:
    """Prebuild, swap e2 to another arch, prebuild: the cluster file and the swapped-out dirs."""
    prebuild(rig, cluster(rig, "before.yaml"))
    old_shared = [d for d in shared_dirs(rig) if marker_arch(d) == ARCHS["e2"]]
    assert len(old_shared) == 1
    path = cluster(rig, "swapped.yaml", {**ARCHS, "e2": SWAPPED})
    done = prebuild(rig, path)
    assert "no host uses any more" not in done.stderr  # far below the 1G default
    stale = [
        f"target/cluster/_shared/{old_shared[0].name}",
        f"target/cluster/e2/{ARCHS['e2'].replace('/', '-')}",
    ]
    return path, stale


def listed(stderr: str) -> list[str]:
    """The entries a clean listed (its table rows), in order."""
    return re.findall(r"^clean: (target/cluster/\S+)\s+\d", stderr, re.M)


def test_clean_removes_exactly_the_swapped_out_dirs(rig: RigCluster) -> None:
    path, stale = stale_after_swap(rig)
    target = rig.project / "target"

    warned = prebuild(rig, path, INVOKE_FDL_STALE_WARNING_SIZE="1K")
    warnings = [line for line in warned.stderr.splitlines() if "no host uses any more" in line]
    assert len(warnings) == 1 and "in 2 target dir(s)" in warnings[0], warned.stderr
    assert "inv clean" in warnings[0]

    before = snapshot(target)
    for args in (("clean", "--dry"), ("--dry", "clean")):
        dry = inv(rig, *args, "--cluster-file", str(path))
        assert dry.returncode == 0, dry.stderr
        assert sorted(listed(dry.stderr)) == sorted(stale), dry.stderr
        assert "2 entries" in dry.stderr and "nothing removed (dry run)" in dry.stderr
        assert snapshot(target) == before

    done = inv(rig, "clean", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert sorted(listed(done.stderr)) == sorted(stale), done.stderr
    assert re.search(r"^clean: removed 2 entries, .+ freed$", done.stderr, re.M), done.stderr
    prefixes = tuple(s.removeprefix("target/") for s in stale)
    kept = {
        p: v
        for p, v in before.items()
        if not any(p == s or p.startswith(s + "/") for s in prefixes)
    }
    assert len(kept) < len(before)
    # Nothing else removed or touched (the parents' mtimes change with their entries).
    parents = {s.rsplit("/", 1)[0] for s in prefixes}
    after = snapshot(target)
    assert sorted(after) == sorted(kept)
    assert {p: v for p, v in after.items() if p not in parents} == {
        p: v for p, v in kept.items() if p not in parents
    }

    again = prebuild(rig, path)
    rows = summary(again.stderr, list(ARCHS))
    assert {host: row["result"] for host, row in rows.items()} == dict.fromkeys(ARCHS, "up to date")
    assert "Compiling" not in again.stderr
    nothing = inv(rig, "clean", "--cluster-file", str(path))
    assert nothing.returncode == 0 and "clean: nothing to remove" in nothing.stderr


def test_clean_is_refused_while_a_prebuild_runs(rig: RigCluster) -> None:
    path = cluster(rig, "busy.yaml")
    prebuild(rig, path)
    leftovers = [
        rig.project / "target/cluster/_shared/precompiled-cu100-0123456789",
        rig.project / "target/cluster/gone/precompiled-cu128",
    ]
    for directory in leftovers:
        (directory / "release").mkdir(parents=True)
        (directory / "release/old").write_text("x")
    run = rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        env={**ENV, "FDL_FIXTURE_BUILD_SLEEP": "5"},
    )
    run.wait_for(lambda: "build(s) with" in run.stderr)
    for args in (("clean",), ("clean", "--all")):
        refused = inv(rig, *args, "--cluster-file", str(path))
        assert refused.returncode == 1
        assert refused.stderr.startswith("fdl: a prebuild is running on this project ("), (
            refused.stderr
        )
        assert "clean refuses to remove target dirs" in refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert all((d / "release/old").is_file() for d in leftovers)
        assert run.process.poll() is None  # the prebuild was still running: really refused
    assert run.finish() == 0, run.stderr
    assert sorted(published(rig, "ddp-bench")) == sorted(ARCHS)
    done = inv(rig, "clean", "--cluster-file", str(path))
    assert done.returncode == 0, done.stderr
    assert sorted(listed(done.stderr)) == [
        "target/cluster/_shared/precompiled-cu100-0123456789",
        "target/cluster/gone",
    ]
    assert not any(d.exists() for d in leftovers)


def test_clean_never_touches_anything_outside_the_cluster_tree(rig: RigCluster) -> None:
    path = cluster(rig, "traps.yaml")
    prebuild(rig, path)
    target = rig.project / "target"
    outside = rig.root / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "precious").write_text("keep")
    (target / "keep-me").write_text("keep")
    (target / "release").mkdir()
    (target / "release/ddp-bench").write_text("the user's own cargo build")
    links = [
        target / "cluster/zz-link",
        target / "cluster/_shared/zz-link",
        target / "cluster/e1/zz-link",
    ]

    def lay_links() -> None:
        for link in links:
            link.unlink(missing_ok=True)
            link.symlink_to(outside, target_is_directory=True)

    libtorch_before = snapshot(rig.project / "libtorch")
    sources_before = {p: snapshot(rig.project / p) for p in ("ddp-bench", "fixture-util")}
    lay_links()
    stale = inv(rig, "clean", "--cluster-file", str(path))
    assert stale.returncode == 0, stale.stderr
    assert sorted(listed(stale.stderr)) == sorted(str(p.relative_to(rig.project)) for p in links)
    lay_links()
    watch_state = target / "cluster/_watch/ddp-bench.json"  # a watcher's, which --all keeps
    watch_state.parent.mkdir()
    watch_state.write_text("{}")
    everything = inv(rig, "clean", "--all", "--cluster-file", str(path))
    assert everything.returncode == 0, everything.stderr
    assert sorted(os.listdir(target / "cluster")) in (["_watch"], ["_prebuild.lock", "_watch"])
    assert watch_state.read_text() == "{}"
    assert not (target / "cluster/_envelopes").exists()

    assert (outside / "precious").read_text() == "keep"
    assert sorted(os.listdir(outside)) == ["precious"]
    assert (target / "keep-me").read_text() == "keep"
    assert (target / "release/ddp-bench").read_text() == "the user's own cargo build"
    assert snapshot(rig.project / "libtorch") == libtorch_before
    assert {p: snapshot(rig.project / p) for p in sources_before} == sources_before
    assert (rig.project / "Cargo.toml").is_file() and (rig.project / "Cargo.lock").is_file()
    # Every envelope went with --all: nothing may launch stale binaries.
    launched = inv(rig, "launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert launched.returncode == 1 and "has no published envelope" in launched.stderr


# ---------------------------------------------------------------------------- 3. summary


def test_summary_says_rebuilt_or_up_to_date_with_the_binarys_hash(rig: RigCluster) -> None:
    path = cluster(rig, "summary.yaml")
    first = prebuild(rig, path)
    assert summary(first.stderr, list(ARCHS))["e1"]["result"] == "rebuilt"
    noop = prebuild(rig, path)
    rows = summary(noop.stderr, list(ARCHS))
    assert {h: r["result"] for h, r in rows.items()} == dict.fromkeys(ARCHS, "up to date")
    hashes = {h: r["binary"] for h, r in rows.items()}
    for host, cell in hashes.items():
        assert re.fullmatch(r"sha256:[0-9a-f]{8}", cell), cell
        copy = rig.project / published(rig, "ddp-bench")[host].bin
        assert hashlib.sha256(copy.read_bytes()).hexdigest().startswith(cell[7:])
    assert "build-ddp-bench.log" not in noop.stderr  # log paths only in failure reports

    main_rs = rig.project / MAIN_RS
    main_rs.write_text(main_rs.read_text().replace('cuda={cuda}");', 'cuda={cuda} edited=1");'))
    edited = prebuild(rig, path)
    rows = summary(edited.stderr, list(ARCHS))
    assert {h: r["result"] for h, r in rows.items()} == dict.fromkeys(ARCHS, "rebuilt")
    for host, row in rows.items():
        assert re.fullmatch(r"sha256:[0-9a-f]{8}", row["binary"])
        assert row["binary"] != hashes[host], host
    assert "build-ddp-bench.log" not in edited.stderr
    for host, arch in ARCHS.items():
        line = rig.run_on_host(host, str(rig.project), published(rig, "ddp-bench")[host])
        assert line == f"{expected_line('ddp-bench', arch)} edited=1"


def test_an_unchanged_build_starts_no_container(rig: RigCluster) -> None:
    """A no-op in docker run mode: each build's record shows nothing it read changed, so no
    container starts; verification and publication still run, and any change (a source,
    the variant, the binary, --timings, the setting) lets cargo decide again."""
    path = docker_cluster(rig, "unchanged.yaml")
    first = prebuild(rig, path)
    hashes = {h: r["binary"] for h, r in summary(first.stderr, list(ARCHS)).items()}
    shim, calls = docker_calls(rig, "unchanged")
    envelope = envelope_path(rig, "ddp-bench")
    envelope.unlink()  # so that this run's publication is seen

    noop = prebuild(rig, path, **shim)
    assert containers_run(calls) == 0, calls.read_text()
    assert noop.stderr.count("ok (unchanged since its last build: cargo not started)") == 3
    rows = summary(noop.stderr, list(ARCHS))
    assert {h: r["result"] for h, r in rows.items()} == dict.fromkeys(ARCHS, "up to date")
    assert {h: r["binary"] for h, r in rows.items()} == hashes
    assert re.search(r"^verify: 3 host\(s\) verified", noop.stderr, re.M), noop.stderr
    assert envelope.is_file()
    for host, arch in ARCHS.items():
        line = rig.run_on_host(host, str(rig.project), published(rig, "ddp-bench")[host])
        assert line == expected_line("ddp-bench", arch)

    variant = rig.project / "libtorch" / ARCHS["e2"] / "lib"
    (variant / "fdl-record-test").write_text("a new file in e2's variant")
    try:
        assert cargo_ran(prebuild(rig, path, **shim).stderr) == 1  # e2's build alone
    finally:
        (variant / "fdl-record-test").unlink()
    # the file gone again: e2's build again, the others not
    assert cargo_ran(prebuild(rig, path, **shim).stderr) == 1

    (rig.project / shared_dirs(rig)[0] / "release/ddp-bench").touch()
    assert cargo_ran(prebuild(rig, path, **shim).stderr) == 1  # the touched binary's build
    # cargo's report needs cargo
    assert cargo_ran(prebuild(rig, path, "ddp-bench", "--timings", **shim).stderr) == 3
    assert cargo_ran(prebuild(rig, path, **shim, INVOKE_FDL_SKIP_UNCHANGED="0").stderr) == 3

    main_rs = rig.project / MAIN_RS
    main_rs.write_text(main_rs.read_text().replace('cuda={cuda}");', 'cuda={cuda} edited=1");'))
    edited = prebuild(rig, path, **shim)
    assert cargo_ran(edited.stderr) == 3
    rows = summary(edited.stderr, list(ARCHS))
    assert {h: r["result"] for h, r in rows.items()} == dict.fromkeys(ARCHS, "rebuilt")
    for host, arch in ARCHS.items():
        line = rig.run_on_host(host, str(rig.project), published(rig, "ddp-bench")[host])
        assert line == f"{expected_line('ddp-bench', arch)} edited=1"


def test_native_builds_speak_of_no_containers(rig: RigCluster) -> None:
    """Native cargo starts no container: its start line names none."""
    done = prebuild(rig, cluster(rig, "native.yaml"))
    start = [line for line in done.stderr.splitlines() if "build(s) with native cargo" in line]
    assert len(start) == 1, done.stderr
    assert "container" not in start[0], start[0]


# ---------------------------------------------------------------------------- 4. a typo


def connections_seen(rig: RigCluster, name: str) -> int:
    """TCP connections the host's sshd has accepted so far (its log, at LogLevel VERBOSE)."""
    return rig.rig.log_path(name).read_text(errors="replace").count("Connection from")


def test_a_misspelt_command_is_refused_at_once(rig: RigCluster) -> None:
    path = docker_cluster(rig, "typo.yaml")
    prebuild(rig, path, "ddp-bench")
    prebuild(rig, path, "ddp-eval")
    envelopes = {c: envelope_path(rig, c).read_bytes() for c in COMMANDS}
    before = snapshot(rig.project / "target")
    shim, calls = docker_calls(rig, "typo")

    connections = {host.name: connections_seen(rig, host.name) for host in HOSTS}
    done = inv(rig, "prebuild", "--cmd", "ddp-bnech", "--cluster-file", str(path), **shim)
    assert done.returncode == 1
    assert "did you mean 'ddp-bench'?" in done.stderr
    assert done.stderr.startswith("fdl: no binary 'ddp-bnech' in ")
    assert done.stderr.count("\n") == 1, done.stderr
    # "At once": before any host was dialled, not merely quickly.
    assert {host.name: connections_seen(rig, host.name) for host in HOSTS} == connections
    assert calls.read_text() == ""  # no docker command at all, so no container
    assert containers(f"{OWNER_LABEL}={rig.owner}", "fdl-tasks.run") == []  # no build's
    assert snapshot(rig.project / "target") == before  # no target dir, nothing touched
    assert {c: envelope_path(rig, c).read_bytes() for c in COMMANDS} == envelopes


# ---------------------------------------------------------------------------- 5. controller label


def without_host_name(rig: RigCluster) -> dict[str, str]:
    environment = rig.environment(ENV)
    del environment["FLODL_HOST_NAME"]
    return environment


def run_without_host_name(rig: RigCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        inv_argv(*args),
        cwd=rig.root,
        env=without_host_name(rig),
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


def test_an_unlisted_hostname_is_one_note(rig: RigCluster) -> None:
    """A controller that is no worker is usual: one note line (no warning), saying how
    to name it, said once per cluster file (``-v`` again); a name no worker carries is
    itself a note, a worker's label none."""
    path = cluster(rig, "label.yaml")
    hostname = socket.gethostname()
    assert hostname not in ARCHS
    for task, args in (
        ("prebuild", ("prebuild", "--cmd", "ddp-bench")),
        ("preflight", ("preflight",)),
    ):
        done = run_without_host_name(rig, *args, "-v", "--cluster-file", str(path))
        assert done.returncode == 0, done.stderr
        lines = done.stderr.splitlines()
        warned = [i for i, line in enumerate(lines) if "names no host of" in line]
        assert len(warned) == 1, done.stderr
        line = lines[warned[0]]
        assert line.startswith(f"{task}: note: this machine's hostname {hostname!r}"), line
        assert "warning" not in line, line
        for way in ("--controller-host", "$FLODL_HOST_NAME", "fdl.controller_host"):
            assert way in line, line
        # Said before any host is contacted.
        first_host = min(i for i, text in enumerate(lines) if re.search(r"\be[123]\b", text))
        assert warned[0] < first_host, done.stderr

    again = run_without_host_name(rig, "preflight", "--cluster-file", str(path))
    assert again.returncode == 0 and "names no host of" not in again.stderr, again.stderr
    chosen = run_without_host_name(
        rig, "preflight", "--controller-host", "ctrl", "--cluster-file", str(path)
    )
    assert chosen.returncode == 0, chosen.stderr
    assert "note: the controller's name 'ctrl' (--controller-host" in chosen.stderr
    worker = run_without_host_name(
        rig, "preflight", "-v", "--controller-host", "e1", "--cluster-file", str(path)
    )
    assert worker.returncode == 0, worker.stderr
    assert "names no host of" not in worker.stderr


# ---------------------------------------------------------------------------- 6. verification


VERIFIED = re.compile(r"^verify: 2 host\(s\) verified \([^)]*\), 1 not verified: e3 \(.+\)$", re.M)


def vanishing_host_run(rig: RigCluster, path: Path, sleep: str, *options: str) -> Running:
    """A prebuild whose host e3 stops answering once the (slow) builds have started."""
    run = rig.background(
        "prebuild",
        "--cmd",
        "ddp-bench",
        *options,
        "--cluster-file",
        str(path),
        env={**ENV, "FDL_FIXTURE_BUILD_SLEEP": sleep},
    )
    run.wait_for(lambda: "build(s) with" in run.stderr)
    # e3 answered the preflight: every host ok, said by the summary alone
    assert "\npreflight: 4 ok, 0 with warnings, 0 with errors\n" in run.stderr, run.stderr
    rig.rig.stop_host("e3")
    return run


def test_a_host_gone_before_verification_is_counted_not_verified(rig: RigCluster) -> None:
    path = cluster(rig, "vanish.yaml")
    run = vanishing_host_run(rig, path, "3")
    assert run.finish() == 0, run.stderr
    assert VERIFIED.search(run.stderr), run.stderr
    assert sorted(published(rig, "ddp-bench")) == sorted(ARCHS)  # e3 still gets its entry


def test_require_verified_makes_an_unverified_host_an_error(rig: RigCluster) -> None:
    path = cluster(rig, "strict.yaml")
    run = vanishing_host_run(rig, path, "2.5", "--require-verified")
    assert run.finish() == 1, run.stderr
    assert VERIFIED.search(run.stderr), run.stderr
    assert (
        "1 host(s) not verified and fdl.require_verified is on; no envelope was published: e3 ("
        in run.stderr
    )
    assert not envelope_path(rig, "ddp-bench").exists()
    assert "Traceback" not in run.stderr

    # The setting does the same; here e3 is down from the start (a preflight warning).
    done = inv(
        rig,
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--cluster-file",
        str(path),
        INVOKE_FDL_REQUIRE_VERIFIED="1",
    )
    assert done.returncode == 1, done.stderr
    assert "fdl.require_verified is on; no envelope was published: e3 (" in done.stderr
    assert not envelope_path(rig, "ddp-bench").exists()


def test_require_verified_is_not_silently_dropped_by_no_verify(rig: RigCluster) -> None:
    """--no-verify leaves every host unverified: with --require-verified asked for too,
    publishing an envelope anyway would ignore what the user required."""
    path = cluster(rig, "noverify.yaml")
    done = inv(
        rig,
        "prebuild",
        "--cmd",
        "ddp-bench",
        "--no-verify",
        "--require-verified",
        "--cluster-file",
        str(path),
    )
    assert done.returncode == 1, done.stderr
    assert "require" in done.stderr and "Traceback" not in done.stderr
    assert not envelope_path(rig, "ddp-bench").exists()


# ---------------------------------------------------------------------------- 8. build-host


def test_build_host_updates_its_own_entry_and_keeps_the_others(rig: RigCluster) -> None:
    prebuild(rig, cluster(rig, "all.yaml"))
    before = published(rig, "ddp-bench")
    path = cluster(rig, "one.yaml", {**ARCHS, "e2": SWAPPED})
    done = inv(
        rig,
        "build-host",
        "--host",
        "e2",
        "--cmd",
        "ddp-bench",
        "--json",
        "--cluster-file",
        str(path),
        # The compile cache on, as by default: its line is labelled too.
        INVOKE_FDL_COMPILE_CACHE="1",
        INVOKE_FDL_COMPILE_CACHE_DIR=str(rig.root / "sccache"),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    labelled = [line.split(":", 1)[0] for line in lines if re.match(r"^[a-z-]+: ", line)]
    assert "prebuild" not in labelled, done.stderr
    assert "build-host" in labelled, done.stderr
    entry = decode(done.stdout, "stdout")
    assert sorted(entry) == ["e2"]
    assert entry["e2"].bin == f"target/cluster/e2/{SWAPPED.replace('/', '-')}/release/ddp-bench"
    assert entry["e2"].ld_library_path == f"{rig.project}/libtorch/{SWAPPED}/lib"
    assert f"build-host: envelope entry {done.stdout.strip()}" in lines
    assert re.search(r"^verify: 1 host\(s\) verified", done.stderr, re.M), done.stderr

    after = published(rig, "ddp-bench")
    assert sorted(after) == sorted(ARCHS)
    assert after["e2"] == entry["e2"]
    assert after["e1"] == before["e1"] and after["e3"] == before["e3"]
    line = rig.run_on_host("e2", str(rig.project), after["e2"])
    assert line == expected_line("ddp-bench", SWAPPED)
    launched = inv(rig, "launch", "--cmd", "ddp-bench", "--cluster-file", str(path))
    assert launched.returncode == 0, launched.stderr
    assert f"[e2] {expected_line('ddp-bench', SWAPPED)}" in launched.stdout
    assert f"[e1] {expected_line('ddp-bench', ARCHS['e1'])}" in launched.stdout
