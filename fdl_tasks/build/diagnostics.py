"""Each diagnostic once: what several builds print alike, said once naming the builds.

Pure. Builds of one program for several variants mostly fail alike: a syntax
error in a shared source is the same error in every build. A diagnostic is
held until every build still running has given it too (or finished without
it), then said once: ``error in cu128, cu126, cpu: …``. Two diagnostics are
the same once each build's own strings (its target dir, id, variant) and
cargo's hashes are set aside; the first build's text is what is shown.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import attrs

_HASH = re.compile(r"\b[0-9a-f]{16}\b")
_HEADER = re.compile(r"^(error|warning)(\[[A-Za-z0-9_]+\])?:\s?")


def normalized(lines: Sequence[str], own: Sequence[str]) -> str:
    """The diagnostic with the build's ``own`` strings and cargo's hashes set aside."""
    text = "\n".join(lines)
    for word in sorted(filter(None, own), key=len, reverse=True):
        text = text.replace(word, "<build>")
    return _HASH.sub("<hash>", text)


def said(builds: Sequence[str], lines: Sequence[str]) -> list[str]:
    """``error[E0425] in cu128, cpu: …`` and the rest of the diagnostic as it was; any
    other line prefixed ``[cu128, cpu]``."""
    head, *rest = lines
    named = ", ".join(builds)
    header = _HEADER.match(head)
    if header is None:
        return [f"[{named}] {head}", *rest]
    return [f"{header[1]}{header[2] or ''} in {named}: {head[header.end() :]}", *rest]


@attrs.define
class _Group:
    key: tuple[str, int]
    lines: tuple[str, ...]
    builds: list[str]


class Grouper:
    """The diagnostics of one run's builds (``builds``: their labels, in the run's order)."""

    def __init__(self, builds: Sequence[str]) -> None:
        self.builds = list(builds)
        self._finished: set[str] = set()
        self._pending: list[_Group] = []
        self._given: Counter[tuple[str, str]] = Counter()

    def add(self, build: str, lines: Sequence[str], own: Sequence[str]) -> list[list[str]]:
        """A diagnostic of ``build``; what is now ready to be said, each as its lines.

        The n-th time a build gives one text meets the n-th time another does.
        """
        text = normalized(lines, own)
        self._given[build, text] += 1
        key = (text, self._given[build, text])
        group = next((g for g in self._pending if g.key == key), None)
        if group is None:
            self._pending.append(_Group(key, tuple(lines), [build]))
        else:
            group.builds.append(build)
        return self._ready()

    def finish(self, build: str) -> list[list[str]]:
        """``build`` will give no more: what waited for it is ready now."""
        self._finished.add(build)
        return self._ready()

    def _ready(self) -> list[list[str]]:
        running = {b for b in self.builds if b not in self._finished}
        ready = [g for g in self._pending if running <= set(g.builds)]
        self._pending = [g for g in self._pending if g not in ready]
        return [said(self._ordered(g.builds), g.lines) for g in ready]

    def _ordered(self, builds: Sequence[str]) -> list[str]:
        return sorted(set(builds), key=lambda b: self.builds.index(b) if b in self.builds else 0)
