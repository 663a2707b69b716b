"""The ``--timings`` recorder and page: spans on an injected clock, the HTML and its data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fdl_tasks.build.build_step import cargo_report
from fdl_tasks.core.timeline import Timeline, fold_rounds
from fdl_tasks.timings.recording import KEEP
from fdl_tasks.timings.timings_html import DATA_ID, page_data, render


def ticking(*values: float) -> Timeline:
    clock = iter(values)
    return Timeline(clock=lambda: next(clock))


def test_spans_are_seconds_from_the_runs_start_in_step_order() -> None:
    timeline = ticking(10.0, 10.5, 11.0, 13.0, 14.0, 14.0)
    with timeline.span("preflight", "ctl"):  # 10.5 .. 11.0
        pass
    timeline.add("build", "cu128", 11.0, 12.5, hosts=("a", "b"), link="x/cargo-timing.html")
    timeline.add("verify", "a", 12.5, 12.75)
    with pytest.raises(RuntimeError), timeline.span("publish", "cmd"):  # 13 .. 14, raised
        raise RuntimeError
    timeline.finish()
    data = timeline.data(task="prebuild", command="cmd")
    assert data["wall"] == 4.0
    spans = data["spans"]
    assert isinstance(spans, list)
    assert [(s["kind"], s["start"], s["seconds"], s["ok"]) for s in spans] == [
        ("preflight", 0.5, 0.5, True),
        ("build", 1.0, 1.5, True),
        ("verify", 2.5, 0.25, True),
        ("publish", 3.0, 1.0, False),
    ]
    assert spans[1]["hosts"] == ["a", "b"] and spans[1]["link"] == "x/cargo-timing.html"


def test_finish_fixes_the_wall_time() -> None:
    timeline = ticking(0.0, 2.0, 9.0)
    timeline.finish()
    assert timeline.data()["wall"] == 2.0


def test_round_trips_fold_into_one_span_per_host_ending_as_the_last_try() -> None:
    rounds = [("a", 1.0, 2.0, True), ("b", 1.0, 2.0, False), ("b", 3.0, 4.0, True)]
    assert fold_rounds(rounds) == {"a": (1.0, 2.0, True), "b": (1.0, 4.0, True)}
    assert fold_rounds([("c", 1.0, 2.0, True), ("c", 3.0, 4.0, False)]) == {"c": (1.0, 4.0, False)}


def sample() -> dict[str, object]:
    timeline = ticking(0.0, 4.0)
    timeline.add("build", "<b>&", 1.0, 3.0, hosts=("h1", "h2"), link="../_shared/x/t.html")
    timeline.add("verify", "h1", 3.0, 3.5, ok=False)
    timeline.finish()
    return timeline.data(task="prebuild", command="cmd", ok=False, started="2026-12-01")


def test_the_page_embeds_its_data_and_reads_back_exactly() -> None:
    data = sample()
    page = render(data)
    assert page_data(page) == data
    assert page.count(f'id="{DATA_ID}"') == 1


def test_the_page_is_self_contained() -> None:
    page = render(sample())
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<link" not in page and "<script src" not in page
    assert "<style>" in page and "<svg" in page


def test_names_are_escaped_and_cannot_end_the_data_script() -> None:
    timeline = ticking(0.0, 1.0)
    timeline.add("build", "</script><script>alert(1)</script>", 0.0, 1.0)
    page = render(timeline.data())
    assert "<script>alert" not in page
    assert page_data(page)["spans"][0]["name"] == "</script><script>alert(1)</script>"  # type: ignore[index]


def test_bars_scale_with_time_and_failures_are_marked() -> None:
    page = render(sample())
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)"', page)]
    assert widths[0] == pytest.approx(4 * widths[1])  # 2 s against 0.5 s
    assert "verify FAILED" in page and "#b85450" in page
    assert 'href="../_shared/x/t.html"' in page and "h1, h2" in page
    assert page_data("<html></html>") is None


def test_cargo_report_is_this_builds_newest(tmp_path: Path) -> None:
    reports = tmp_path / "cargo-timings"
    assert cargo_report(tmp_path, since=0) is None
    reports.mkdir()
    old, new = (
        reports / "cargo-timing-20260101T000000Z.html",
        reports / "cargo-timing-20270101T000000Z.html",
    )
    old.write_text("old")
    new.write_text("new")
    assert cargo_report(tmp_path, since=0) == new
    assert (
        cargo_report(tmp_path, since=new.stat().st_mtime + 60) is None
    )  # written before this build
    assert KEEP >= 2


def test_the_label_column_fits_the_longest_label() -> None:
    timeline = ticking(0.0, 1.0)
    name = "precompiled-cu128-217a5a6e76-and-then-some"
    timeline.add("build", name, 0.0, 1.0)
    page = render(timeline.data())
    bar_x = float(re.findall(r'<rect x="([\d.]+)"', page)[0])
    label_x = float(re.findall(r'<text x="([\d.]+)" y="\d+" text-anchor="end">', page)[0])
    assert label_x >= 7 * len(f"build {name}")  # right-aligned there, starting past 0
    assert bar_x >= label_x
