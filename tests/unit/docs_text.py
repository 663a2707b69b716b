"""What README.md and docs/*.md say, read as a reader reads it: headings, links,
code blocks, inline code and the ``inv`` command lines in both.

Only text is read here; :mod:`tests.unit.test_docs` holds each claim against the code.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    page: Path
    lang: str
    text: str


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks (indented ones too, as in a list item)."""
    found = []
    for indent, lang, body in _FENCE.findall(page.read_text()):
        lines = [line.removeprefix(indent) for line in body.splitlines(keepends=True)]
        found.append(Block(page, lang, "".join(lines)))
    return found


def prose(page: Path) -> str:
    """The page without its code blocks."""
    return _FENCE.sub("", page.read_text())


def spans(page: Path) -> list[str]:
    """Inline code of the prose, a span broken over lines joined with one space."""
    return [re.sub(r"\s*\n\s*", " ", span) for span in _SPAN.findall(prose(page))]


def links(page: Path) -> list[str]:
    return _LINK.findall(prose(page))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", prose(page), re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def inv_lines(page: Path) -> Iterator[list[str]]:
    """Every ``inv …`` command the page shows, split as a shell splits it.

    From inline code and from the lines of its code blocks (a ``$ `` prompt, an
    environment assignment before ``inv`` and a trailing comment are dropped);
    everything from a ``--`` on goes to the program and is left out.
    """
    lines = spans(page)
    for block in blocks(page):
        lines += [line for line in block.text.splitlines() if block.lang in ("sh", "text", "")]
    for line in lines:
        line = line.removeprefix("$ ").strip()
        line = re.sub(r"^(\w+=\S* )+", "", line)
        if not line.startswith("inv ") or "…" in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        yield words[: words.index("--")] if "--" in words else words


def standalone_options(page: Path) -> Iterator[str]:
    """Options named alone in inline code: ``--no-cache``, ``-w/--watch``, ``--json``."""
    for span in spans(page):
        for word in re.split(r"[/, ]+", span):
            if re.fullmatch(r"--[a-z][a-z0-9-]*", word) and re.fullmatch(r"[-/, a-z0-9]+", span):
                yield word


def repo_paths(page: Path) -> Iterator[str]:
    """Paths in this repository the page names: inline code and relative links."""
    top = r"(fdl_tasks|rig|tests|bench|scripts|docs|\.ci)/[\w./-]*(::\w+)?"
    roots = r"README\.md|fdl\.cluster\.yml|cluster\.yaml|invoke\.yaml|tasks\.py|pyproject\.toml"
    last = ""  # `::test_x` after `test_y.py::…`: the same file
    for span in spans(page):
        word = span.replace(":: ", "::").split(" ")[0]  # a command's program; a broken span
        if re.fullmatch(r"test_\w+\.py(::\w+)?", word):  # a test module named alone
            found = sorted((ROOT / "tests").rglob(word.split("::")[0]))
            word = (
                str(found[0].relative_to(ROOT)) + word[len(word.split("::")[0]) :]
                if found
                else word
            )
        elif re.fullmatch(r"::test_\w+", word) and last:
            word = last + word
        if re.fullmatch(top, word) or re.fullmatch(roots, word) or word.startswith("test_"):
            last = word.split("::")[0]
            yield word
    for link in links(page):
        target = link.split("#")[0]
        if target and "://" not in target:
            yield str((page.parent / target).resolve().relative_to(ROOT))


def table_rows(page: Path, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` (the header row left out)."""
    text = prose(page)
    rest = text[text.index(heading) :]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
        elif rows:
            break
    return [row for row in rows[1:] if not set(row[0]) <= set("-: ")]
