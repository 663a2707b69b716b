"""bench.loop's L5 row: a dependency change, 3 variants in existing target dirs, vs one.

Each repetition changes the binary package's ``regex`` dependency to a set of
features never built before (its ``unicode-*`` features, one subset per
change, so ``regex-syntax``, ``regex`` and the package recompile and the
compile cache has none of them yet), then times ``inv prebuild`` of the one
variant of a one-host cluster on the bench's copy of the project (B, with a
compile cache of its own), and ``inv prebuild`` of the 3 variants on the
project (A, the bench's cache): both with the default settings (cache on),
both target trees already built. Target: A/B <= 1.5.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from bench.run import BenchError

UNICODE = ("age", "bool", "case", "gencat", "perl", "script", "segment")
#: Each change: regex without its default features, with std, perf and these.
CHANGES = [c for n in range(len(UNICODE), 0, -1) for c in itertools.combinations(UNICODE, n)]
REGEX = re.compile(r"^regex = .*$", re.MULTILINE)


class Measured(Protocol):
    seconds: float


M = TypeVar("M", bound=Measured)


def set_regex(crate_dir: Path, unicode: tuple[str, ...]) -> None:
    """The binary package's ``regex`` requirement with exactly these ``unicode-*`` features."""
    manifest = crate_dir / "Cargo.toml"
    features = ", ".join(f'"{f}"' for f in ("std", "perf", *(f"unicode-{u}" for u in unicode)))
    line = f'regex = {{ version = "1", default-features = false, features = [{features}] }}'
    text, count = REGEX.subn(line, manifest.read_text(), count=1)
    if count != 1:
        raise BenchError(f"no regex dependency in {manifest}")
    manifest.write_text(text)


def dependency_changes(
    crate_dirs: Sequence[Path],
    reps: int,
    three: Callable[[], M],
    one: Callable[[], M],
    log: Callable[[str], None],
) -> list[tuple[M, M]]:
    """(3 variants, 1 variant) per change: both target trees built once first."""
    log("L5: both target trees built once before any change")
    three()
    one()
    samples = []
    for rep, change in zip(range(reps), CHANGES, strict=False):
        for crate_dir in crate_dirs:
            set_regex(crate_dir, change)
        b = one()
        a = three()
        samples.append((a, b))
        log(f"L5 rep {rep + 1}/{reps}: 3 variants {a.seconds:.1f}s, one {b.seconds:.1f}s")
    return samples
