"""Which builds wait for another: only a compile cache that can be warmed for the others
(cold target dirs, or dependencies changed since the last builds) is worth a head start."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_order import concurrency, head_start, order_text
from fdl_tasks.cargo.manifests import changed_since
from fdl_tasks.config.layout import MARKER_FILE


@pytest.mark.parametrize(
    ("cached", "cold", "builds", "expected"),
    [
        (True, True, 3, 1),  # the first build warms the cache for the other two
        (False, True, 3, 0),  # no cache (off, or sccache missing): nothing to warm
        (True, False, 3, 0),  # a target dir exists: the head start would only cost time
        (True, True, 1, 0),  # one build waits for nobody
    ],
)
def test_only_a_cold_cache_gets_a_head_start(
    cached: bool, cold: bool, builds: int, expected: int
) -> None:
    assert head_start(cached=cached, cold=cold, builds=builds) == expected


@pytest.mark.parametrize(
    ("cached", "builds", "expected"), [(True, 3, 1), (False, 3, 0), (True, 1, 0)]
)
def test_changed_dependencies_get_a_head_start_with_the_cache(
    cached: bool, builds: int, expected: int
) -> None:
    found = head_start(cached=cached, cold=False, builds=builds, dependencies=True)
    assert found == expected


@pytest.mark.parametrize(
    ("builds", "at_once", "first", "dependencies", "said"),
    [
        (3, 2, 0, False, "2 at a time"),
        (3, 4, 1, False, "the first build alone to fill the cache, then 2 at a time"),
        (2, 2, 1, False, "the first build alone to fill the cache, then 1 at a time"),
        (
            5,
            2,
            1,
            True,
            "the first build alone to fill the cache with the changed dependencies, "
            "then 2 at a time",
        ),
    ],
)
def test_the_order_line_says_what_the_builder_does(
    builds: int, at_once: int, first: int, dependencies: bool, said: str
) -> None:
    """``2 build(s) with native cargo, 2 at a time`` while a cold cache ran them one after
    the other was a line saying one thing while the program did another (issue 39)."""
    assert order_text(builds, at_once, first, dependencies) == said


def workspace(root: Path) -> tuple[Path, Path]:
    """A workspace with one member ``app``, a lockfile, and a target dir's marker."""
    (root / "app/src").mkdir(parents=True)
    (root / "Cargo.toml").write_text('[workspace]\nmembers = ["app"]\n')
    (root / "app/Cargo.toml").write_text('[package]\nname = "app"\nversion = "0.1.0"\n')
    (root / "app/src/main.rs").write_text("fn main() {}\n")
    (root / "Cargo.lock").write_text("version = 3\n")
    (root / ".cargo").mkdir()
    (root / ".cargo/config.toml").write_text("")
    marker = root / "target/x/.fdl-build.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    for path in root.rglob("*"):
        os.utime(path, (1000, 1000))
    os.utime(marker, (2000, 2000))
    return root / "app", marker


@pytest.mark.parametrize(
    ("touched", "changed"),
    [
        ("app/Cargo.toml", True),  # a new dependency, a dependency's features
        ("Cargo.toml", True),  # the workspace's own dependencies
        ("Cargo.lock", True),  # cargo update
        (".cargo/config.toml", True),
        ("app/src/main.rs", False),  # an edit of the workspace's own code
    ],
)
def test_a_dependency_file_newer_than_a_target_dirs_last_build(
    tmp_path: Path, touched: str, changed: bool
) -> None:
    crate, marker = workspace(tmp_path)
    assert not changed_since([crate], [marker])
    os.utime(tmp_path / touched, (3000, 3000))
    assert changed_since([crate], [marker]) is changed


def test_no_marker_or_an_unreadable_manifest_is_no_change(tmp_path: Path) -> None:
    crate, marker = workspace(tmp_path)
    os.utime(tmp_path / "Cargo.lock", (3000, 3000))
    assert not changed_since([crate], [tmp_path / "missing"])
    (tmp_path / "Cargo.toml").write_text("[workspace\n")  # cargo itself will say what is wrong
    assert not changed_since([crate], [marker])


@pytest.mark.parametrize(
    ("warm", "configured", "expected"),
    [
        (False, 0, 4),  # a cold target dir: one build per core
        (True, 0, 8),  # every target dir built: two per core (incremental rebuilds)
        (True, 3, 3),  # fdl.build_jobs wins
    ],
)
def test_builds_at_once_follow_the_cores_and_the_target_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool, configured: int, expected: int
) -> None:
    """9 builds on 4 cores: the rule, apart from how many cores the test machine has."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    jobs = [SimpleNamespace(target_dir=f"target/cluster/_shared/v{i}") for i in range(9)]
    for job in jobs if warm else jobs[1:]:
        (tmp_path / job.target_dir).mkdir(parents=True)
        (tmp_path / job.target_dir / MARKER_FILE).touch()
    assert concurrency(configured, cast(list[BuildJob], jobs), tmp_path) == expected
