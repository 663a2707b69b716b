"""``prebuild --watch``: what counts as a change, where to watch, when to build (pure),
and how a launch waits for a watcher (against files in a temporary directory)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.build.build_environment import Build, BuildEnvironment, CrossBuild
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import collect
from fdl_tasks.publish.verification_io import Verification
from fdl_tasks.tree.buildscripts import declared_inputs, host_path, rerun_declarations
from fdl_tasks.tree.roots import WatchPlan, watch_plan
from fdl_tasks.tree.scope import ChangeKind, Scope, gone_directory, make_scope
from fdl_tasks.tree.snapshot import Change
from fdl_tasks.watch.debounce import Debouncer
from fdl_tasks.watch.filewatch import relevant_changes
from fdl_tasks.watch.launchwait import wait_for_watch
from fdl_tasks.watch.lines import (
    build_labels,
    busy_reason,
    cycle_line,
    describe_changes,
    stopped_line,
    verified_text,
)
from fdl_tasks.watch.polling import mount_fstype, needs_polling, polling_choice
from fdl_tasks.watch.state_files import WatchFiles

ROOT = "/srv/proj"
CU128 = f"{ROOT}/libtorch/precompiled/cu128"


def scope(**fields: object) -> Scope:
    defaults: dict[str, object] = {
        "root": ROOT,
        "cluster_files": ["/home/me/cluster.yaml"],
        "variants": [CU128],
        "package_dirs": [ROOT, f"{ROOT}/ddp-bench", f"{ROOT}/flodl-sys"],
    }
    defaults.update(fields)
    return make_scope(**defaults)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- what counts


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"{ROOT}/ddp-bench/src/main.rs", ChangeKind.SOURCE),
        (f"{ROOT}/flodl/src/tensor/ops.rs", ChangeKind.SOURCE),  # a path dependency elsewhere
        (f"{ROOT}/ddp-bench/build.rs", ChangeKind.SOURCE),
        (f"{ROOT}/Cargo.toml", ChangeKind.MANIFEST),
        (f"{ROOT}/Cargo.lock", ChangeKind.MANIFEST),
        (f"{ROOT}/ddp-bench/Cargo.toml", ChangeKind.MANIFEST),
        (f"{ROOT}/.cargo/config.toml", ChangeKind.BUILD_CONFIG),
        (f"{ROOT}/rust-toolchain.toml", ChangeKind.BUILD_CONFIG),
        (f"{CU128}/lib/libtorch.so", ChangeKind.LIBTORCH),
        (f"{CU128}/build-version", ChangeKind.LIBTORCH),
        ("/home/me/cluster.yaml", ChangeKind.CLUSTER),
        # never: build output, version control, other variants, editor files, logs
        (f"{ROOT}/target/cluster/_shared/x/release/build/a-1/out/gen.rs", None),
        (f"{ROOT}/target/cluster/_envelopes/ddp-bench.json", None),
        (f"{ROOT}/target/cluster/_watch/ddp-bench.json", None),
        (f"{ROOT}/ddp-bench/target/release/deps/x.rs", None),  # cargo run in the crate
        (f"{ROOT}/.git/index", None),
        (f"{ROOT}/.git/foo.rs", None),
        (f"{ROOT}/libtorch/precompiled/cu126/lib/libtorch.so", None),  # no build uses it
        (f"{ROOT}/ddp-bench/src/.#main.rs", None),
        (f"{ROOT}/ddp-bench/src/main.rs~", None),
        (f"{ROOT}/ddp-bench/src/.main.rs.swp", None),
        (f"{ROOT}/ddp-bench/src/4913", None),
        (f"{ROOT}/ddp-bench/src/sedNk0P9y", None),
        (f"{ROOT}/ddp-bench/src/#main.rs#", None),
        (f"{ROOT}/ddp-bench/src/.main.rs.swx", None),
        (f"{ROOT}/README.md", None),
        (f"{ROOT}/runs/train.log", None),
        ("/etc/hosts.rs", None),  # outside the workspace: only what is declared
    ],
)
def test_classify(path: str, kind: ChangeKind | None) -> None:
    assert scope().classify(path) == kind


def test_a_source_dir_named_target_below_src_still_counts() -> None:
    assert scope().classify(f"{ROOT}/ddp-bench/src/target/mod.rs") is ChangeKind.SOURCE


def test_cluster_file_inside_the_root_and_paths_not_normalised() -> None:
    inside = scope(cluster_files=[f"{ROOT}/cluster.yaml"])
    assert inside.classify(f"{ROOT}/cluster.yaml") is ChangeKind.CLUSTER
    assert inside.classify(f"{ROOT}/ddp-bench/../ddp-bench/src//main.rs") is ChangeKind.SOURCE


def test_every_file_of_a_flodl_cluster_counts_as_the_cluster_file() -> None:
    """``fdl.yml``, its overlay, a parent named by ``inherit-from:`` and ``fdl-tasks.yml``:
    a save of any re-reads the cluster."""
    layers = [f"{ROOT}/fdl.yml", "/home/me/shared.yml", f"{ROOT}/fdl.cluster.yml"]
    flodl = scope(cluster_files=[*layers, f"{ROOT}/fdl-tasks.yml"])
    for path in [*layers, f"{ROOT}/fdl-tasks.yml"]:
        assert flodl.classify(path) is ChangeKind.CLUSTER, path
    assert flodl.classify(f"{ROOT}/fdl.vm.yml") is None  # another env's overlay
    assert "/home/me" in watch_plan(flodl, [], lambda p: True).flat  # outside the root


def test_declared_inputs_and_whole_packages() -> None:
    s = scope(
        declared=[f"{ROOT}/proto/model.proto", "/usr/local/include/nccl.h", f"{ROOT}/kernels"],
        whole_packages=[f"{ROOT}/flodl-sys"],
    )
    assert s.classify(f"{ROOT}/proto/model.proto") is ChangeKind.DECLARED
    assert s.classify("/usr/local/include/nccl.h") is ChangeKind.DECLARED
    assert s.classify(f"{ROOT}/kernels/gemm.cu") is ChangeKind.DECLARED  # a declared directory
    assert s.classify(f"{ROOT}/flodl-sys/csrc/wrap.cpp") is ChangeKind.DECLARED
    assert s.classify(f"{ROOT}/flodl-sys/train.log") is None
    assert s.classify(f"{ROOT}/flodl-sys/target/x.o") is None
    assert s.classify(f"{ROOT}/proto/other.proto") is None
    named = scope(declared=[f"{ROOT}/.env", f"{ROOT}/.hidden/schema.json"])
    assert named.classify(f"{ROOT}/.env") is ChangeKind.DECLARED  # named: whatever its name
    assert named.classify(f"{ROOT}/.hidden/schema.json") is ChangeKind.DECLARED


def test_make_scope_drops_declarations_under_a_target_dir_and_excludes_own_dirs() -> None:
    s = scope(
        declared=[f"{ROOT}/target/cluster/_shared/a/release/build/x-1/out/gen.h", ROOT],
        own=["/srv/proj/.sccache"],
    )
    assert s.declared == ()
    assert f"{ROOT}/ddp-bench/target" in s.excluded
    assert s.classify("/srv/proj/.sccache/a/b.rs") is None


def test_gone_directory() -> None:
    s = scope()
    assert gone_directory(s, f"{ROOT}/ddp-bench/src/layers") is ChangeKind.SOURCE
    assert gone_directory(s, f"{ROOT}/ddp-bench/src/notes.txt") is None
    assert gone_directory(s, f"{ROOT}/target/cluster/x") is None
    assert gone_directory(s, f"{ROOT}/.git/refs") is None
    # a save's temporary file, renamed over the real one: gone, but never a directory
    assert gone_directory(s, f"{ROOT}/ddp-bench/src/sedNk0P9y") is None
    assert gone_directory(s, f"{ROOT}/ddp-bench/src/4913") is None
    assert gone_directory(s, f"{ROOT}/ddp-bench/src/#main.rs#") is None


def test_scope_survives_json() -> None:
    s = scope(declared=[f"{ROOT}/proto"], whole_packages=[f"{ROOT}/flodl-sys"])
    assert Scope.from_json(json.loads(json.dumps(s.to_json()))) == s
    with pytest.raises(ValueError):
        Scope.from_json({"root": ROOT})


# ---------------------------------------------------------------------------- build scripts


def test_rerun_declarations_both_syntaxes() -> None:
    output = (
        "cargo:rustc-link-lib=dylib=torch\n"
        "cargo:rerun-if-changed=build.rs\n"
        "cargo::rerun-if-changed=/workspace/proto\n"
        "cargo:rerun-if-env-changed=LIBTORCH\n"
        "cargo:rerun-if-changed=\n"
    )
    assert rerun_declarations(output) == ["build.rs", "/workspace/proto"]


def test_host_path_maps_container_mounts() -> None:
    mounts = [("/workspace", ROOT), ("/opt/libtorch", None)]
    assert host_path("/workspace/ddp-bench/wrap.h", mounts) == f"{ROOT}/ddp-bench/wrap.h"
    assert host_path("/workspace", mounts) == ROOT
    assert host_path("/opt/libtorch/lib/libtorch.so", mounts) is None  # the variant: watched
    assert host_path("/workspaces/x", mounts) == "/workspaces/x"  # not under the mount
    assert host_path("/usr/include/x.h", []) == "/usr/include/x.h"


def test_declared_inputs() -> None:
    packages = {"flodl-sys": [f"{ROOT}/flodl-sys"], "ddp-bench": [f"{ROOT}/ddp-bench"]}
    outputs = [
        ("flodl-sys", "cargo:rerun-if-changed=csrc/wrap.cpp\ncargo:rerun-if-changed=../proto\n"),
        ("ddp-bench", "cargo:rerun-if-changed=/opt/libtorch/lib/libtorch.so\n"),
        ("cc", "cargo:rerun-if-changed=/workspace/ddp-bench/shim.c\n"),  # a registry crate
        ("libc", "cargo:rerun-if-changed=build.rs\n"),  # relative, not in the workspace
        ("quiet", "cargo:rustc-cfg=x\n"),  # declares nothing, not in the workspace
    ]
    declared, whole = declared_inputs(
        outputs, packages, [("/workspace", ROOT), ("/opt/libtorch", None)]
    )
    assert declared == [
        f"{ROOT}/ddp-bench/shim.c",
        f"{ROOT}/flodl-sys/csrc/wrap.cpp",
        f"{ROOT}/proto",
    ]
    assert whole == []
    _, whole = declared_inputs([("ddp-bench", "cargo:rustc-link-lib=torch\n")], packages)
    assert whole == [f"{ROOT}/ddp-bench"]


# ---------------------------------------------------------------------------- where to watch


def test_watch_plan_skips_target_vcs_and_unused_variants() -> None:
    s = scope(
        variants=[CU128, f"{ROOT}/libtorch/builds/sm61-sm120"],
        declared=["/usr/local/include/nccl.h"],
    )
    existing = {ROOT, f"{ROOT}/libtorch", f"{CU128}/lib", CU128, "/home/me", "/usr/local/include"}
    tops = ["ddp-bench", "flodl", "target", ".git", "libtorch", ".cargo", ".idea"]
    plan = watch_plan(s, tops, existing.__contains__)
    assert plan == WatchPlan(
        recursive=(f"{ROOT}/.cargo", f"{ROOT}/ddp-bench", f"{ROOT}/flodl", f"{CU128}/lib"),
        flat=("/home/me", ROOT, f"{ROOT}/libtorch", CU128, "/usr/local/include"),
    )


def test_watch_plan_watches_declared_files_in_hidden_dirs() -> None:
    s = scope(declared=[f"{ROOT}/.hidden/schema.json"])
    plan = watch_plan(s, [".hidden"], lambda p: True)
    assert f"{ROOT}/.hidden" in plan.flat and f"{ROOT}/.hidden" not in plan.recursive


def test_watch_plan_drops_flat_dirs_inside_watched_trees() -> None:
    s = scope(cluster_files=[f"{ROOT}/ops/cluster.yaml"])
    plan = watch_plan(s, ["ops"], lambda p: True)
    assert f"{ROOT}/ops" in plan.recursive
    assert all(not p.startswith(f"{ROOT}/ops") for p in plan.flat)


# ---------------------------------------------------------------------------- network mounts

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
60 27 0:50 / /srv rw,relatime shared:1 - nfs4 nas:/export rw,vers=4.2
61 60 0:51 / /srv/proj\\040copy rw - fuse.sshfs me@box:/p rw
62 27 0:52 / /mnt/data rw - ext4 /dev/vdb rw
63 27 0:53 / /mnt/data rw - virtiofs share rw
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/srv/proj", "nfs4"),
        ("/srv", "nfs4"),
        ("/srv/proj copy/src", "fuse.sshfs"),  # the mount point's escaped space
        ("/srvx", "ext4"),
        ("/mnt/data/x", "virtiofs"),  # stacked mounts: the last one is visible
        ("/home/me", "ext4"),
    ],
)
def test_mount_fstype(path: str, fstype: str) -> None:
    assert mount_fstype(MOUNTINFO, path) == fstype


def test_mount_fstype_without_mountinfo() -> None:
    assert mount_fstype("", "/x") is None


@pytest.mark.parametrize(
    ("fstype", "poll"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("cifs", True),
        ("smb3", True),
        ("9p", True),
        ("virtiofs", True),
        ("fuse.sshfs", True),
        ("fuse.s3fs", True),
        ("fuse.mountpoint-s3", True),
        ("fuse.rclone", True),
        ("ext4", False),
        ("xfs", False),
        ("btrfs", False),
        ("tmpfs", False),
        ("overlay", False),
        ("fuseblk", False),  # ntfs-3g: a local disk
        ("fuse.fuse-overlayfs", False),
    ],
)
def test_needs_polling(fstype: str, poll: bool) -> None:
    assert needs_polling(fstype) is poll


def test_polling_choice() -> None:
    root = Path(ROOT)
    assert polling_choice(root, "ext4", forced=True) == (
        True,
        "polling every 0.5s (fdl.watch_polling)",
    )
    poll, how = polling_choice(root, "nfs4", forced=False)
    assert poll and how.startswith(f"polling every 0.5s: {ROOT} is on nfs4")
    assert polling_choice(root, "ext4", forced=False) == (False, "inotify on ext4")
    assert polling_choice(root, None, forced=False) == (False, "inotify on an unknown filesystem")


# ---------------------------------------------------------------------------- when


def src(n: int) -> dict[str, ChangeKind]:
    return {f"{ROOT}/src/m{n}.rs": ChangeKind.SOURCE}


def test_a_removal_among_the_changes_is_said() -> None:
    s = scope()
    main, swap = f"{ROOT}/ddp-bench/src/main.rs", f"{ROOT}/ddp-bench/src/.main.rs.swp"
    relevant, _, removal = relevant_changes(s, {(Change.modified, main)})
    assert relevant == {main: ChangeKind.SOURCE} and not removal
    assert relevant_changes(s, {(Change.deleted, main), (Change.added, main)})[2]
    assert not relevant_changes(s, {(Change.deleted, swap), (Change.modified, main)})[2]


def test_a_lone_save_after_calm_starts_at_once() -> None:
    d = Debouncer(quiet=0.3, longest=3.0)
    assert d.state == "idle" and d.due_at() is None
    d.add(src(1), 10.0)
    assert d.due_at() == 10.0 and d.due(10.0)
    assert d.start() == src(1)
    d.finish()
    d.add(src(2), 10.2)  # 0.2 s after the last save: a burst goes on, so it settles
    assert not d.due(10.45) and d.due(10.5)
    d.start()
    d.finish()
    d.add(src(3), 12.0)  # calm again
    assert d.due(12.0)


def test_a_batch_that_begins_with_a_removal_settles() -> None:
    d = Debouncer(quiet=0.3, longest=3.0)
    d.add(src(1), 10.0, settle=True)  # vim, emacs: the old file renamed away first
    assert not d.due(10.29) and d.due(10.3)


def test_the_rest_of_a_burst_is_one_batch_once_quiet() -> None:
    d = Debouncer(quiet=0.3, longest=3.0)
    d.add(src(9), 9.9)  # the burst's first save: a cycle at once
    d.start()
    d.finish()
    for i in range(10):  # then ten saves in one second
        d.add(src(i % 3), 10.0 + i * 0.1)
        assert not d.due(10.0 + i * 0.1 + 0.05)
    assert d.state == "pending"
    assert d.due_at() == pytest.approx(11.2)
    assert not d.due(11.1) and d.due(11.21)
    assert d.start() == {**src(0), **src(1), **src(2)}
    assert d.state == "building"


def test_a_steady_trickle_cannot_starve_the_build() -> None:
    d = Debouncer(quiet=0.3, longest=3.0, building=True)
    d.add(src(1), -0.2)  # saved during a cycle: this batch settles
    d.finish()
    t = 0.0
    while not d.due(t):
        d.add(src(1), t)
        t += 0.2
    assert t == pytest.approx(2.8, abs=0.25)


def test_saves_during_a_build_queue_exactly_one_more() -> None:
    d = Debouncer(quiet=0.3, longest=3.0, building=True)  # the first prebuild
    for i in range(5):
        d.add(src(i), 1.0 + i)
        assert not d.due(1.0 + i + 10)  # never while building
    assert d.state == "building" and d.queued
    d.finish()
    assert d.state == "pending" and not d.queued
    assert d.due(20.0)  # the last save is long settled: at once
    assert len(d.start()) == 5
    d.finish()
    assert d.state == "idle" and not d.due(100.0)


def test_a_save_just_before_the_build_ends_still_waits_to_settle() -> None:
    d = Debouncer(quiet=0.3, longest=3.0, building=True)
    d.add(src(1), 5.0)
    d.finish()
    assert not d.due(5.1) and d.due(5.3)


def test_a_watchers_debouncer_builds_first_and_polling_settles_longer() -> None:
    d = Debouncer.for_watch(0.3, polling=False)
    assert (d.quiet, d.longest, d.state) == (0.3, 3.0, "building")
    assert Debouncer.for_watch(0.3, polling=True).quiet == 0.75  # more than one walk
    assert Debouncer.for_watch(2.0, polling=True).quiet == 2.0


def test_start_needs_an_idle_debouncer() -> None:
    d = Debouncer(quiet=0.3, longest=3.0, building=True)
    with pytest.raises(RuntimeError):
        d.start()
    d.add({}, 1.0)  # nothing relevant: nothing pending
    d.finish()
    assert d.state == "idle"


def simulate(saves: list[float], build_seconds: float, quiet: float = 0.3) -> list[float]:
    """The start times of the cycles a series of saves causes, 10 ms steps."""
    d = Debouncer(quiet=quiet, longest=10 * quiet)
    starts: list[float] = []
    busy_until: float | None = None
    pending = sorted(saves)
    for step in range(int((max(saves) + 30) * 100)):
        now = step / 100
        while pending and pending[0] <= now:
            d.add(src(len(pending)), pending.pop(0))
        if busy_until is not None and now >= busy_until:
            d.finish()
            busy_until = None
        if busy_until is None and d.due(now):
            d.start()
            starts.append(now)
            busy_until = now + build_seconds
    return starts


def test_simulated_editor_sessions() -> None:
    # a burst: its first save builds at once, the rest exactly one more, right after
    assert simulate([1.0 + i / 10 for i in range(10)], 5.0) == pytest.approx([1.0, 6.0])
    # saves in the middle of a 5 s build: exactly one more, right after it
    assert simulate([1.0, 3.0, 3.05, 4.0], 5.0) == pytest.approx([1.0, 6.0])
    # a burst that outlasts a short build: the rest waits until it settles
    starts = simulate([1.0 + i / 10 for i in range(10)], 0.25)
    assert starts == pytest.approx([1.0, 2.2])
    # two lone saves far apart: each at once
    assert simulate([1.0, 20.0], 2.0) == pytest.approx([1.0, 20.0])


# ---------------------------------------------------------------------------- what it says


def test_describe_changes() -> None:
    assert describe_changes({}, ROOT) == "nothing changed"
    assert describe_changes(src(1), ROOT) == "src/m1.rs changed"
    assert describe_changes({"/home/me/cluster.yaml": ChangeKind.CLUSTER}, ROOT) == (
        "/home/me/cluster.yaml changed"
    )
    many = {**src(1), **src(2), **src(3), **src(4)}
    assert describe_changes(many, ROOT) == "4 files changed (src/m1.rs, src/m2.rs, src/m3.rs, …)"


def test_cycle_line() -> None:
    line = cycle_line(3, 4.25, "src/m1.rs changed", ["precompiled/cu128"], 2, "3 host(s) verified")
    assert line == (
        "watch: cycle 3 ok in 4.2s (src/m1.rs changed): rebuilt precompiled/cu128 "
        "(2 up to date); 3 host(s) verified; published"
    )
    assert "): preflight ok; 3 build(s) up to date; v;" in cycle_line(4, 1.0, "x", [], 3, "v", True)


def test_build_labels() -> None:
    def spec(arch: str, cross: CrossBuild | None = None) -> Build:
        return Build(BuildEnvironment("docker", arch, (), "img", cross=cross), "ddp-bench", "")

    arm = CrossBuild("aarch64", "aarch64-unknown-linux-gnu", "aarch64-linux-gnu-gcc")
    specs = [spec("precompiled/cu128"), spec("precompiled/cu128"), spec("precompiled/cpu", arm)]
    assert build_labels(specs) == ["precompiled/cu128 x2", "precompiled/cpu (aarch64)"]


def test_verified_text() -> None:
    assert verified_text(None) == "verification off (--no-verify)"
    verification = Verification(verified=("a", "b"), unverified={"c": "unreachable"}, problems=())
    assert verified_text(verification) == "2 host(s) verified, 1 not verified: c (unreachable)"


def test_stopped_line() -> None:
    assert stopped_line("p", 3, False, True, True) == (
        "watch stopped; the envelope of p stays published (cycle 3's)"
    )
    assert stopped_line("p", 3, False, True, False) == (
        "watch stopped; the envelope of p stays published"
    )
    assert stopped_line("p", 4, True, False, True) == (
        "watch stopped during cycle 4; no envelope of p is published"
    )


def test_busy_reason() -> None:
    assert busy_reason({"state": "building", "cycle": 2, "queued": False}) == "cycle 2 is building"
    assert "waits for the next" in str(busy_reason({"state": "building", "queued": True}))
    assert busy_reason({"state": "pending"}) == "a change is waiting for its cycle"
    assert busy_reason({"state": "idle"}) is None
    assert busy_reason({"state": "failed"}) is None


# ---------------------------------------------------------------------------- launch waits


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src/main.rs").write_text("fn main() {}\n")
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "p"\n')
    (tmp_path / "target/cluster/_watch").mkdir(parents=True)
    return tmp_path


def write_state(project: Path, state: str, stamp_ns: int | None, **more: object) -> None:
    s = make_scope(str(project), str(project / "cluster.yaml"), [], [str(project)])
    data = {
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "state": state,
        "queued": False,
        "cycle": 2,
        "stamp_ns": stamp_ns,
        "scope": s.to_json(),
        **more,
    }
    (project / "target/cluster/_watch/p.json").write_text(json.dumps(data))


@pytest.fixture
def held(project: Path) -> Iterator[None]:
    """The lock a live watcher holds."""
    with (project / "target/cluster/_watch/p.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def later_than_sources(project: Path) -> int:
    stamp = project / "target/cluster/_watch/p.stamp"
    stamp.touch()
    future = time.time() + 5
    os.utime(stamp, (future, future))
    return stamp.stat().st_mtime_ns


def test_no_watcher_no_wait(project: Path) -> None:
    said: list[str] = []
    wait_for_watch(project, "p", 1.0, collect(said))
    assert said == []


def test_a_dead_watchers_state_is_ignored(project: Path) -> None:
    write_state(project, "building", None)
    (project / "target/cluster/_watch/p.lock").touch()  # nobody holds it
    said: list[str] = []
    started = time.monotonic()
    wait_for_watch(project, "p", 30.0, collect(said))
    assert time.monotonic() - started < 10  # the bound is 30 s
    assert said and "has ended" in said[0]


def test_a_building_cycle_is_waited_for_within_the_bound(project: Path, held: None) -> None:
    write_state(project, "building", later_than_sources(project))
    said: list[str] = []
    with pytest.raises(FdlError, match=r"not published in 0.5s \(cycle 2 is building\)"):
        wait_for_watch(project, "p", 0.5, collect(said))
    assert said == [
        f"launch: waiting for the prebuild watcher (pid {os.getpid()}): cycle 2 is building"
    ]


def test_an_idle_current_watcher_lets_launch_go(project: Path, held: None) -> None:
    write_state(project, "idle", later_than_sources(project))
    said: list[str] = []
    wait_for_watch(project, "p", 5.0, collect(said))
    assert said == []


def test_a_change_the_watcher_has_not_seen_yet_is_waited_for(project: Path, held: None) -> None:
    stamp_ns = (project / "Cargo.toml").stat().st_ctime_ns + 1  # after Cargo.toml's last change
    time.sleep(0.01)
    (project / "src/main.rs").write_text("fn main() { }\n")  # then a save
    write_state(project, "idle", stamp_ns)
    said: list[str] = []
    with pytest.raises(FdlError, match=r"src/main\.rs changed after cycle 2 started"):
        wait_for_watch(project, "p", 0.4, collect(said))


def test_a_failed_last_cycle_is_an_error(project: Path, held: None) -> None:
    write_state(project, "failed", later_than_sources(project))
    with pytest.raises(FdlError, match="failed its last cycle"):
        wait_for_watch(project, "p", 5.0, collect([]))


def test_watch_files_live_under_target_cluster_watch(tmp_path: Path) -> None:
    files = WatchFiles(tmp_path, "ddp-bench")
    assert files.state == tmp_path / "target/cluster/_watch/ddp-bench.json"
    assert files.lock.parent == files.stamp.parent == files.state.parent
