"""How each build ended, and its record on its way.

A build's result is handed on as soon as cargo ends and the binary is read, while
its record is still being written: what follows the builds (verification's round
trip) runs beside it, and :func:`settled` waits for it under the project lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import attrs

from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_record import BuildRecord, tree_digest
from fdl_tasks.cache.cache_stats import CacheStats
from fdl_tasks.core.binary_files import BinaryFacts


@attrs.frozen(kw_only=True)
class JobResult:
    """How one build ended: ``rebuilt`` when cargo wrote a new binary, its ``sha256``."""

    job: BuildJob
    ok: bool
    seconds: float
    detail: str = ""
    exit_code: int | None = None
    log_tail: str = ""
    cache: CacheStats | None = None
    rebuilt: bool = False
    sha256: str = ""
    #: The digest of the tree the binary was built from, as its build record says
    #: (:func:`~fdl_tasks.build.build_record.tree_digest`; empty without a record).
    tree: str = ""
    #: The binary's digest and glibc need, as its record has them (``None``: not read yet).
    facts: BinaryFacts | None = None
    #: When the build started (``time.monotonic``): ``--timings`` draws it.
    started: float = 0.0
    #: Its record being written, after cargo, beside what follows the builds
    #: (verification's round trip); :func:`settled` waits for it and fills in ``tree``.
    recording: Future[BuildRecord | None] | None = attrs.field(default=None, eq=False)


def settled(results: Sequence[JobResult]) -> list[JobResult]:
    """The results with every record written and its tree digest in; call before the
    project lock is released (a record written later could replace a newer run's)."""
    done = []
    for result in results:
        if result.recording is not None:
            record = result.recording.result()
            tree = tree_digest(record) if record else ""
            result = attrs.evolve(result, tree=tree, recording=None)
        done.append(result)
    return done
