"""The live status of builds: rich's live region on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io
import re
import time

from fdl_tasks.core.console import PrefixedLines, StatusBoard, clock

ESCAPE = re.compile(r"\x1b|\r")


def test_plain_lines_carry_no_escape_codes_and_say_progress_every_few_seconds() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=False, every=0.05) as board:
        board.started("job-a", "cu128 (alpha, beta)", name="cu128")
        board.progress("job-a", 23, 63, "serde_derive")
        board.say("warning in cu128: unused variable")
        deadline = time.monotonic() + 5
        while "23/63 units" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        board.finished("job-a")
        board.say("prebuild: cu128 (alpha, beta) ok in 1.2s")
    text = out.getvalue()
    assert not ESCAPE.search(text)
    lines = text.splitlines()
    assert "warning in cu128: unused variable" in lines
    assert re.search(r"^cu128: 23/63 units, \d+ s$", text, re.M), text
    assert lines[-1] == "prebuild: cu128 (alpha, beta) ok in 1.2s"


def test_a_terminal_gets_one_live_line_per_build_erased_at_the_end() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=True) as board:
        board.started("a", "cu128 (alpha)", expected=100.0)
        board.started("b", "cpu (gamma)")
        board.progress("a", 5, 40, "serde_derive")
        board.say("error in cu128, cpu: expected `;`")
        board.finished("b")
        board.say("prebuild: cpu (gamma) FAILED (cargo exited 101) in 2.0s")
        board._progress.refresh()  # type: ignore[union-attr]  # a redraw, as the timer does
        drawn = out.getvalue()
    assert "5/40" in drawn and "serde_derive" in drawn and "s left" in drawn
    assert "error in cu128, cpu: expected `;`\n" in drawn
    assert "prebuild: cpu (gamma) FAILED (cargo exited 101) in 2.0s\n" in drawn
    # The live region is transient: its lines are erased at the end (rich's own codes).
    assert out.getvalue().endswith("\x1b[2K"), repr(out.getvalue()[-40:])


def test_the_clock_says_what_the_last_run_leaves() -> None:
    assert clock(12.4) == "12 s"
    assert clock(12.4, 40.0) == "12 s, ~28 s left"
    assert clock(50.0, 40.0) == "50 s"


def test_prefixed_lines_log_everything_and_hold_partial_lines() -> None:
    log, echo = io.StringIO(), io.StringIO()
    stream = PrefixedLines("h", log, echo)
    stream.write("one\ntw")
    assert echo.getvalue() == "[h] one\n"
    stream.write("o\n")
    stream.write("three")
    stream.close_line()
    assert echo.getvalue() == "[h] one\n[h] two\n[h] three\n"
    assert log.getvalue() == "one\ntwo\nthree\n"
