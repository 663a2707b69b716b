"""Atomic replacement on the shared mount: what a failed or a killed write leaves."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from fdl_tasks.core.atomic_files import remove_partials, replace_atomically
from fdl_tasks.core.errors import FdlError


def test_an_unfinished_write_leaves_the_old_file_and_no_partial(tmp_path: Path) -> None:
    final = tmp_path / "ddp-bench.json"
    final.write_text("old\n")

    def fill_then_fail(partial: Path) -> None:
        partial.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FdlError, match=rf"cannot write {final}: .*No space left on device"):
        replace_atomically(final, fill_then_fail)
    assert final.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp-bench.json"]


def test_partials_a_killed_run_left_are_removed_and_nothing_else(tmp_path: Path) -> None:
    final = tmp_path / "ddp-bench.json"
    kept = ["ddp-bench.json", ".other.json.12.partial", "ddp-bench.json.12.partial"]
    for name in [*kept, ".ddp-bench.json.12.partial", ".ddp-bench.json.345.partial"]:
        (tmp_path / name).write_text("x")
    remove_partials(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
