"""A build record's files in its target dir: their names, the record read back with its
attempt (:mod:`fdl_tasks.build.record_attempt`), and their stats, which tell whether
another run replaced them since they were read."""

from __future__ import annotations

from pathlib import Path

import attrs

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record import BuildRecord
from fdl_tasks.build.record_attempt import attempt_from

#: A record's file name in its target dir, of a command; its attempt's beside it.
RECORD_NAME, ATTEMPT_NAME = ".fdl-record-{}.json", ".fdl-attempt-{}.json"


def record_file(root: Path, job: BuildJob) -> Path:
    """One record per command in each target dir (a target dir builds every command)."""
    return root / job.target_dir / RECORD_NAME.format(job.build.command)


def attempt_file(record: Path) -> Path:
    """The attempt of the record at ``record``: the look of a build since that did not
    end well (:attr:`BuildRecord.attempt`)."""
    prefix, suffix = RECORD_NAME.split("{}")
    return record.with_name(ATTEMPT_NAME.format(record.name[len(prefix) : -len(suffix)]))


def read_record(path: Path) -> BuildRecord | None:
    """The record at ``path`` with its attempt, if any; ``None`` for no record it can trust
    (none, torn, of another version, not UTF-8, its attempt unreadable)."""
    try:
        record = BuildRecord.from_json(path.read_text(encoding="utf-8"))
        if record is None:
            return None
        try:
            text = attempt_file(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return record
        attempt = attempt_from(text, record)
    except (OSError, ValueError):
        return None
    return attrs.evolve(record, attempt=attempt) if attempt else record


def file_stats(record: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """The record's and its attempt's files as they are (``None``: none)."""
    found: list[tuple[int, int, int] | None] = []
    for path in (record, attempt_file(record)):
        try:
            stat = path.stat()
            found.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        except OSError:
            found.append(None)
    return tuple(found)
