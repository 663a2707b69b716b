"""'did you mean …?': close matches of a mistyped name (a command, a host label)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_matches(word: str, names: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """Up to three close matches, case and ``-``/``_`` folded first (``ddp_bench`` ->
    ``ddp-bench``); ``cutoff``: :func:`difflib.get_close_matches`' least similarity."""

    def fold(name: str) -> str:
        return name.lower().replace("_", "-")

    by_fold: dict[str, list[str]] = {}
    for name in sorted(names):
        by_fold.setdefault(fold(name), []).append(name)
    chosen = list(by_fold.get(fold(word), []))
    for key in difflib.get_close_matches(fold(word), list(by_fold), n=3, cutoff=cutoff):
        chosen.extend(n for n in by_fold[key] if n not in chosen)
    return chosen[:3]


def quoted_choice(names: list[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
