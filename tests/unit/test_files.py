"""Atomic replacement on the shared mount: what a failed or a killed write leaves."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fdl_tasks.core.atomic_files import (
    SECOND_NS,
    copy_atomically,
    remove_partials,
    replace_atomically,
)
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


def test_a_copy_is_kept_only_while_its_nanosecond_time_proves_it(tmp_path: Path) -> None:
    """``copy_atomically`` keeps a copy of the same size and time; a time in whole seconds
    (an SSHFS mount's) proves nothing: a binary relinked in that second at the same size
    is copied again (seen on the rig: the host's own copy kept the last build's bytes)."""
    source, copy = tmp_path / "built", tmp_path / "copy"
    source.write_bytes(b"rev=a0")
    assert copy_atomically(source, copy) and copy.read_bytes() == b"rev=a0"
    source.write_bytes(b"rev=b0")  # relinked: same size
    fine = source.stat().st_mtime_ns | 1  # a nanosecond time, not a whole second
    os.utime(source, ns=(fine, fine))
    os.utime(copy, ns=(fine, fine))
    assert not copy_atomically(source, copy)  # the same size and time: kept
    whole = (fine // SECOND_NS) * SECOND_NS
    os.utime(source, ns=(whole, whole))
    os.utime(copy, ns=(whole, whole))
    assert copy_atomically(source, copy) and copy.read_bytes() == b"rev=b0"
    assert copy.stat().st_mtime_ns == whole  # its time kept, as copy2 does
