"""A build's attempt on disk: the look of a build that started after its record's and
may not end well, written before its cargo starts, beside the record.

Pure. Only what differs from the record's look is written (the files the build
started for): the whole look again, every time cargo is about to run, would be
the record's cost again on the way to every build. It names the record it was
taken over (its ``serial``); a record replaced since, by a build that ended well
and compared with it, makes it void.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from fdl_tasks.build.build_record import VERSION, BuildRecord
from fdl_tasks.tree.snapshot import Snapshot


def attempt_json(record: BuildRecord, attempt: Snapshot) -> str:
    """``attempt`` as what differs from ``record``'s look."""
    base = record.look
    return json.dumps(
        {
            "version": VERSION,
            "record": record.serial,
            **attempt.to_json(changed_from=base),
            "gone": sorted(base.entries.keys() - attempt.entries.keys()),
        }
    )


def attempt_from(text: str, record: BuildRecord) -> Snapshot | None:
    """The attempt ``text`` holds over ``record``; ``None`` when it was taken over
    another record. :class:`ValueError` when ``text`` is not an attempt."""
    try:
        data: Any = json.loads(text)
        if data["version"] != VERSION:
            raise ValueError("attempt")
        if data["record"] != record.serial:
            return None
        changed, gone = Snapshot.from_json(data), set(data["gone"])
        if not all(isinstance(p, str) for p in gone):
            raise ValueError("attempt")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError("attempt") from exc
    kept = {p: e for p, e in record.look.entries.items() if p not in gone}
    return attrs.evolve(changed, entries={**kept, **changed.entries})
