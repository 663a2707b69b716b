"""The ``--timings`` page: one self-contained HTML file drawn from a timeline's data.

Pure logic. Inline CSS and SVG, no external asset, so the page opens from a
shared disk or a copy mailed around; the data itself rides along as JSON in
``<script type="application/json" id="fdl-timings">`` for tools (and tests)
to read back with :func:`page_data`.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fdl_tasks.core.timeline import KINDS

#: The id of the script element that holds the page's data.
DATA_ID = "fdl-timings"
COLORS = {"preflight": "#6c8ebf", "build": "#d79b00", "verify": "#82b366", "publish": "#9673a6"}
FAILED = "#b85450"
CHART_WIDTH, ROW, TOP = 720, 22, 26
#: Pixels per character of a 12 px label (a generous average), so no label is cut.
CHAR_WIDTH = 7.5

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } table { border-collapse: collapse; margin-top: 1.5em; }
td, th { padding: 2px 12px 2px 0; text-align: left; } td.n { text-align: right; }
svg text { font: 12px system-ui, sans-serif; } .axis { stroke: #bbb; }
"""


def _rows(spans: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(spans, key=lambda s: (KINDS.index(s["kind"]), s["start"], s["name"]))


def timeline_svg(wall: float, spans: Sequence[Mapping[str, Any]]) -> str:
    """One row per span, on one time axis from 0 to the run's wall time."""
    scale = CHART_WIDTH / wall if wall > 0 else 0.0
    height = TOP + ROW * len(spans) + 8
    longest = max((len(f"{s['kind']} {s['name']}") for s in spans), default=0)
    label_width = round(CHAR_WIDTH * longest) + 16
    width = label_width + CHART_WIDTH + 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for tick in _ticks(wall):
        x = label_width + tick * scale
        parts.append(f'<line class="axis" x1="{x:.1f}" y1="18" x2="{x:.1f}" y2="{height}"/>')
        parts.append(f'<text x="{x:.1f}" y="12" text-anchor="middle">{tick:g}s</text>')
    for index, span in enumerate(spans):
        y = TOP + index * ROW
        color = COLORS.get(span["kind"], "#999") if span["ok"] else FAILED
        x = label_width + span["start"] * scale
        bar = max(1.0, (span["end"] - span["start"]) * scale)
        label = html.escape(f"{span['kind']} {span['name']}")
        parts += [
            f'<text x="{label_width - 8}" y="{y + 14}" text-anchor="end">{label}</text>',
            f'<rect x="{x:.1f}" y="{y + 3}" width="{bar:.1f}" height="{ROW - 6}" '
            f'fill="{color}"><title>{label}: {span["seconds"]:.3f}s</title></rect>',
            f'<text x="{x + bar + 4:.1f}" y="{y + 14}">{span["seconds"]:.2f}s</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)


def _ticks(wall: float) -> list[float]:
    """About five round ticks from 0 to ``wall``."""
    if wall <= 0:
        return [0.0]
    steps = (0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1e9)
    step = next(s for s in steps if wall / s <= 6)
    return [round(i * step, 6) for i in range(int(wall / step) + 1)]


def _table(spans: Sequence[Mapping[str, Any]]) -> str:
    lines = ["<table><tr><th>step</th><th>for</th><th>start</th><th>seconds</th><th></th></tr>"]
    for span in spans:
        name = html.escape(span["name"])
        if span["hosts"] and list(span["hosts"]) != [span["name"]]:
            name += " (" + html.escape(", ".join(span["hosts"])) + ")"
        link = span.get("link")
        cargo = f'<a href="{html.escape(link)}">cargo --timings</a>' if link else ""
        state = "" if span["ok"] else " FAILED"
        lines.append(
            f"<tr><td>{span['kind']}{state}</td><td>{name}</td>"
            f'<td class="n">{span["start"]:.3f}</td><td class="n">{span["seconds"]:.3f}</td>'
            f"<td>{cargo}</td></tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def render(data: Mapping[str, Any]) -> str:
    """The whole page for one run's :meth:`~fdl_tasks.core.timeline.Timeline.data`."""
    spans = _rows(data["spans"])
    wall = float(data["wall"])
    what = " ".join(str(data[k]) for k in ("task", "command") if data.get(k))
    outcome = "succeeded" if data.get("ok", True) else "failed"
    title = html.escape(f"{what}: {wall:.2f}s")
    embedded = json.dumps(data, sort_keys=True).replace("<", "\\u003c")
    facts = html.escape(f"{data.get('started', '')} · {data.get('mode') or 'no build'} · {outcome}")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{title}</title><style>{STYLE}</style></head><body>",
            f"<h1>{title}</h1><p>{facts}</p>",
            timeline_svg(wall, spans),
            _table(spans),
            f'<script type="application/json" id="{DATA_ID}">{embedded}</script>',
            "</body></html>",
            "",
        ]
    )


_DATA = re.compile(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', re.DOTALL)


def page_data(page: str) -> dict[str, Any] | None:
    """The data a page embeds (``None`` when it holds none)."""
    if (found := _DATA.search(page)) is None:
        return None
    data: dict[str, Any] = json.loads(found.group(1))
    return data
