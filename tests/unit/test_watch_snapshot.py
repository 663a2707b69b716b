"""Nothing missed: the look-and-compare rules (pure), the look at a real tree, the
poller, the watcher's catch-up after a gap, and launch's tie with the stamp."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import collect
from fdl_tasks.tree.roots import WatchPlan
from fdl_tasks.tree.scan import Listings, digest, entry_of, scan
from fdl_tasks.tree.scope import Scope, make_scope
from fdl_tasks.tree.snapshot import (
    RACY_NS,
    Change,
    Entry,
    Snapshot,
    changed_since,
    diff,
    needs_digest,
    racy,
    settled,
    union,
    unseen,
)
from fdl_tasks.tree.workspace import package_dirs
from fdl_tasks.watch.filewatch import Changes, FileWatch
from fdl_tasks.watch.launchwait import wait_for_watch
from fdl_tasks.watch.watcher import Watcher

S = 1_000_000_000
T = 1_700_000_000 * S  # a whole second: what a mount that keeps seconds records
MAIN = "/p/src/main.rs"


def entry(**fields: object) -> Entry:
    base = Entry(False, 120, T, T, 7, 1, 0o100644)
    return attrs.evolve(base, **fields)  # type: ignore[arg-type]


def look(entries: dict[str, Entry], taken_ns: int, dirs: tuple[str, ...] = ("/p/src",)) -> Snapshot:
    return Snapshot(entries, frozenset(dirs), (), taken_ns)


# ---------------------------------------------------------------------------- pure rules


def test_a_stat_close_to_the_change_is_racy_and_a_later_one_is_not() -> None:
    assert racy(entry(), T + S // 2)
    assert racy(entry(), T - S)  # the file's clock ahead of ours: no trust either
    assert not racy(entry(), T + RACY_NS)
    assert not racy(entry(is_dir=True), T)


def test_a_same_second_rewrite_of_the_same_size_is_seen_by_its_content() -> None:
    before = look({MAIN: entry(digest="aaa")}, T + S // 2)
    # the second save: same second, same size, same inode: only the content differs
    assert needs_digest(before.entries[MAIN], entry(), T + S // 2 + 1)
    after = look({MAIN: entry(digest="bbb")}, T + S // 2 + 1)
    assert diff(before, after) == {(Change.modified, MAIN)}
    same = look({MAIN: entry(digest="aaa")}, T + S // 2 + 1)
    assert diff(before, same) == set()


def test_coarse_mtimes_are_settled_by_content_once_then_trusted() -> None:
    first = look({MAIN: entry(digest="aaa")}, T + S // 2)
    later = T + 3 * S  # no longer racy, but the last look was: the content settles it
    assert needs_digest(first.entries[MAIN], entry(), later)
    second = look({MAIN: entry(digest="aaa")}, later)
    assert diff(first, second) == set()
    kept = settled(second)
    assert kept.entries[MAIN].digest is None  # any later save moves the stat
    assert not needs_digest(kept.entries[MAIN], entry(), later + S)
    assert settled(first).entries[MAIN].digest == "aaa"  # still racy: kept


def test_an_inode_swapped_by_rename_is_a_change() -> None:
    before = look({MAIN: entry()}, T + 5 * S)
    assert diff(before, look({MAIN: entry(ino=8)}, T + 6 * S)) == {(Change.modified, MAIN)}


def test_a_ctime_only_change_is_a_change() -> None:
    before = look({MAIN: entry()}, T + 5 * S)
    changed = entry(ctime_ns=T + 4 * S)  # chmod, or an mtime set back by a tool
    assert diff(before, look({MAIN: changed}, T + 6 * S)) == {(Change.modified, MAIN)}


@pytest.mark.parametrize("field", ["size", "mtime_ns", "dev", "mode"])
def test_every_stat_field_counts(field: str) -> None:
    before = look({MAIN: entry()}, T + 5 * S)
    after = look({MAIN: entry(**{field: getattr(entry(), field) + 1})}, T + 6 * S)
    assert diff(before, after) == {(Change.modified, MAIN)}


def test_added_deleted_and_directories() -> None:
    src = "/p/src"
    before = look({MAIN: entry(), f"{src}/old.rs": entry(), f"{src}/d": entry(is_dir=True)}, T)
    after = look(
        {MAIN: entry(), f"{src}/new.rs": entry(), f"{src}/d": entry(is_dir=True, size=9)}, T
    )
    assert diff(before, after) == {
        (Change.added, f"{src}/new.rs"),
        (Change.deleted, f"{src}/old.rs"),
    }
    replaced = look({MAIN: entry(is_dir=True), f"{src}/d": entry(is_dir=True)}, T)
    assert (Change.modified, MAIN) in diff(before, replaced)


def test_a_region_only_one_look_covers() -> None:
    lib = "/p/libtorch/cpu/lib"
    before = Snapshot({MAIN: entry()}, frozenset({"/p/src"}), (), T)
    after = Snapshot(
        {
            MAIN: entry(),
            f"{lib}/old.so": entry(mtime_ns=T - S, ctime_ns=T - S),
            f"{lib}/new.so": entry(),
        },
        frozenset({"/p/src", lib}),
        (lib,),
        T + S,
    )
    # newly watched: only what changed at or after the cycle's start counts
    assert diff(before, after, since_ns=T) == {(Change.added, f"{lib}/new.so")}
    assert diff(before, after) == set()
    # no longer watched: no deletion
    assert diff(after, before) == set()
    assert after.covers(f"{lib}/sub/x.so") and not before.covers(f"{lib}/x.so")


def test_unseen_against_the_cycles_record() -> None:
    seen = {MAIN: entry(digest="aaa")}
    assert unseen(seen, MAIN, entry(ctime_ns=T - 1, mtime_ns=T - 1), T) is False  # before it
    assert unseen(seen, MAIN, entry(), T) is None  # a tie, as recorded: the content tells
    assert unseen(seen, MAIN, entry(size=121), T) is True
    assert unseen({}, MAIN, entry(), T) is True  # a tie the cycle never saw
    assert unseen({MAIN: entry()}, MAIN, entry(), T) is False  # a trusted stat
    assert changed_since(
        look({MAIN: entry(), "/p/a.rs": entry(mtime_ns=T - 1, ctime_ns=T - 1)}, T), T
    ) == {MAIN: entry()}


def test_entry_json() -> None:
    e = entry(digest="abc")
    assert Entry.from_json(json.loads(json.dumps(e.to_json()))) == e
    for bad in ([1, 2], None, [0, 1, 2, 3, 4, 5, 6, None], [False, "1", 2, 3, 4, 5, 6, None]):
        with pytest.raises(ValueError):
            Entry.from_json(bad)


# ---------------------------------------------------------------------------- a real tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for path in ("src/main.rs", "Cargo.toml", "target/x.rs", ".git/y.rs", "cache/z.rs"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x\n")
    (tmp_path / "libtorch/cpu/lib").mkdir(parents=True)
    (tmp_path / "libtorch/cpu/lib/libtorch.so").write_text("so")
    return tmp_path


def tree_scope(root: Path) -> Scope:
    return make_scope(str(root), str(root / "c.yaml"), [], [str(root)], own=[str(root / "cache")])


def test_a_look_skips_what_the_plan_skips_and_reads_only_racy_files(tree: Path) -> None:
    s = tree_scope(tree)
    plan = WatchPlan((str(tree / "src"),), (str(tree),))
    first = scan(WatchPlan((str(tree),), ()), s, None, time.time_ns())
    assert sorted(os.path.relpath(p, tree) for p in first.entries) == [
        ".git",
        "Cargo.toml",
        "cache",
        "libtorch",
        "src",
        "src/main.rs",
        "target",
    ]
    assert first.entries[str(tree / "src/main.rs")].digest == digest(str(tree / "src/main.rs"))
    assert first.entries[str(tree / "target")].digest is None  # a directory
    later = scan(plan, s, None, time.time_ns() + RACY_NS)
    assert later.entries[str(tree / "src/main.rs")].digest is None
    assert str(tree / "src") in later.dirs and later.trees == (str(tree / "src"),)


def test_a_same_size_rewrite_right_after_a_look_is_a_change(tree: Path) -> None:
    s, main = tree_scope(tree), tree / "src/main.rs"
    plan = WatchPlan((str(tree / "src"),), ())
    before = scan(plan, s, None, time.time_ns())
    main.write_text("y\n")
    after = scan(plan, s, before, time.time_ns())
    assert diff(before, after) == {(Change.modified, str(main))}
    assert entry_of(main.stat()).same_stat(after.entries[str(main)])


def test_the_looks_of_one_moment_list_each_directory_once(tree: Path) -> None:
    """A run's builds look at one tree beside preflight: a later look reuses what the
    first listed, as a look taken with it, so with the earliest of their clocks; a look
    with listings of its own sees the tree as it is now."""
    s, main = tree_scope(tree), tree / "src/main.rs"
    plan = WatchPlan((str(tree / "src"),), ())
    together, first_clock = Listings(), time.time_ns()
    first = scan(plan, s, None, together.clock(first_clock), listings=together)
    main.write_text("longer\n")
    second = scan(plan, s, None, together.clock(first_clock + RACY_NS), listings=together)
    assert together.taken_ns == first_clock
    assert second.entries[str(main)].same_stat(first.entries[str(main)])
    assert second.entries[str(main)].size == len("x\n")  # listed once, before the save
    alone = scan(plan, s, None, time.time_ns())
    assert alone.entries[str(main)].size == len("longer\n")


def test_two_looks_together_keep_the_earlier_entry_where_they_differ(tree: Path) -> None:
    s, main = tree_scope(tree), tree / "src/main.rs"
    plan = WatchPlan((str(tree / "src"),), ())
    before = scan(plan, s, None, time.time_ns())
    main.write_text("longer\n")
    (tree / "src/lib.rs").write_text("x\n")
    after = scan(plan, s, None, time.time_ns())
    both = union(before, after)
    assert both.entries[str(main)] == before.entries[str(main)]
    assert str(tree / "src/lib.rs") in both.entries and both.taken_ns == after.taken_ns
    assert union(None, after) is after


@pytest.mark.parametrize("polling", [True, False])
def test_the_file_watch_sees_a_save_right_after_its_first_look(tree: Path, polling: bool) -> None:
    """A save just before the watcher is in place, another the moment it is (the same
    second, the same size)."""
    s, main = tree_scope(tree), tree / "src/main.rs"
    got: Changes = set()
    arrived = threading.Event()

    def receive(changes: Changes) -> None:
        got.update(changes)
        if (Change.modified, str(main)) in changes and "b" in main.read_text():
            arrived.set()

    plan = WatchPlan((str(tree / "src"),), ())

    def slow_first_look(p: WatchPlan, last: Snapshot | None) -> Snapshot:
        if last is None:
            time.sleep(0.3)  # a big tree: the first look takes a while
        return scan(p, s, last, time.time_ns())

    watch = FileWatch(plan, polling, receive, lambda e: None, slow_first_look)
    main.write_text("a\n")
    watch.start().wait_ready()
    try:
        main.write_text("b\n")
        assert arrived.wait(10), got
    finally:
        watch.stop()


@pytest.mark.parametrize("polling", [True, False])
def test_a_change_no_watcher_saw_joins_the_pending_batch(tree: Path, polling: bool) -> None:
    main = tree / "src/main.rs"
    w = Watcher(tree, tree_scope(tree), polling, 0.3, collect([]), lambda: None)
    w.rewatch()
    try:
        w.checkpoint(time.time_ns())
        assert w.watch is not None
        w.watch.stop()  # the gap: the old watcher gone, the new one not in place yet
        main.write_text("y\n")
        w.finish()
        assert w.debouncer.changes == {}
        w.rewatch(catch_up=True)
        assert list(w.debouncer.changes) == [str(main)]
    finally:
        w.stop()


def test_an_event_for_what_the_cycle_started_with_is_no_change(tree: Path) -> None:
    """inotify may deliver a save after catch-up put it in a cycle that has started: the
    cycle's starting look has the file as it is (by stat, or by content for a save in
    the last seconds), so the event starts no further cycle. A save after that look, or
    a file removed since, is a change."""
    main = tree / "src/main.rs"
    main.write_text("saved before the cycle\n")
    w = Watcher(tree, tree_scope(tree), True, 0.3, collect([]), lambda: None)
    w.checkpoint(time.time_ns())
    w.finish()  # the first cycle, of the whole tree
    assert w.baseline is not None and w.baseline.entries[str(main)].digest is not None  # racy
    w.receive({(Change.modified, str(main))})
    assert w.debouncer.changes == {}
    main.write_text("saved during the cycle\n")
    w.receive({(Change.modified, str(main))})
    assert list(w.debouncer.changes) == [str(main)]
    assert list(w.debouncer.start()) == [str(main)]  # the next cycle has it
    w.finish()
    w.checkpoint(time.time_ns())
    w.receive({(Change.modified, str(main))})  # late again
    assert w.debouncer.changes == {}
    main.unlink()
    w.receive({(Change.deleted, str(main))})
    assert list(w.debouncer.changes) == [str(main)]


# ---------------------------------------------------------------------------- launch's tie


@pytest.fixture
def held(tree: Path) -> Iterator[None]:
    (tree / "target/cluster/_watch").mkdir(parents=True)
    with (tree / "target/cluster/_watch/p.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def state_with(tree: Path, stamp_ns: int, seen: dict[str, Entry]) -> None:
    data = {
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "state": "idle",
        "queued": False,
        "cycle": 3,
        "stamp_ns": stamp_ns,
        "seen": {p: e.to_json() for p, e in seen.items()},
        "scope": tree_scope(tree).to_json(),
    }
    (tree / "target/cluster/_watch/p.json").write_text(json.dumps(data))


def test_a_save_in_the_stamps_own_tick_is_waited_for(tree: Path, held: None) -> None:
    """On a mount that keeps seconds the stamp and a save after it can carry the same
    time: launch goes only when the file is as the cycle's first look saw it."""
    main = str(tree / "src/main.rs")
    time.sleep(0.01)
    Path(main).write_text("z\n")  # the newest of the tree's files
    now = entry_of(os.stat(main))
    as_seen = attrs.evolve(now, digest=digest(main))
    state_with(tree, now.changed_ns, {main: as_seen})  # a tie, and seen as it is
    wait_for_watch(tree, "p", 2.0, collect([]))
    state_with(tree, now.changed_ns, {main: attrs.evolve(as_seen, digest="0" * 32)})
    with pytest.raises(FdlError, match=r"src/main\.rs changed after cycle 3 started"):
        wait_for_watch(tree, "p", 0.3, collect([]))
    state_with(tree, now.changed_ns, {})  # a tie the cycle has no record of
    with pytest.raises(FdlError, match=r"src/main\.rs changed after cycle 3 started"):
        wait_for_watch(tree, "p", 0.3, collect([]))
    state_with(tree, now.changed_ns + 1, {})  # changed before the stamp: seen
    wait_for_watch(tree, "p", 2.0, collect([]))


def _manifest(path: Path, name: str, *, age_s: float) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "Cargo.toml").write_text(f'[package]\nname = "{name}"\n')
    then = time.time() - age_s
    os.utime(path / "Cargo.toml", (then, then))


def test_a_renamed_package_is_seen_though_its_stat_kept_its_times(tmp_path: Path) -> None:
    """package_dirs parses a manifest again when its stat moved, and while that stat is too
    recent to trust: a rename of the same length with its mtime put back (``rsync -t``)."""
    root = str(tmp_path)
    _manifest(tmp_path / "a", "alpha", age_s=60)
    assert package_dirs(root) == {"alpha": [f"{root}/a"]}
    manifest = tmp_path / "a" / "Cargo.toml"
    mtime = manifest.stat().st_mtime_ns
    manifest.write_text('[package]\nname = "alpho"\n')  # same size; the ctime moves
    os.utime(manifest, ns=(mtime, mtime))
    assert package_dirs(root) == {"alpho": [f"{root}/a"]}
    _manifest(tmp_path / "b", "bravo", age_s=0)  # racy: parsed each time, never kept
    assert package_dirs(root)["bravo"] == [f"{root}/b"]
    (tmp_path / "b" / "Cargo.toml").write_text('[package]\nname = "brava"\n')
    assert package_dirs(root)["brava"] == [f"{root}/b"]


def test_a_look_lists_each_directory_once(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree inside another and directories listed alone inside a walked tree are seen
    once, as the walk saw them; a hidden one (the walk skips it) is listed alone."""
    listed: list[str] = []
    real = os.scandir

    def counted(path: str) -> object:
        listed.append(path)
        return real(path)

    s = tree_scope(tree)
    root, src, git = str(tree), str(tree / "src"), str(tree / ".git")
    whole = scan(WatchPlan((root,), (git,)), s, None, time.time_ns())
    monkeypatch.setattr(os, "scandir", counted)
    look = scan(WatchPlan((root, src), (src, root, git)), s, None, time.time_ns())
    assert look.entries.keys() == whole.entries.keys() and f"{git}/y.rs" in look.entries
    assert sorted(listed) == sorted(set(listed)) and set(listed) == set(look.dirs)
