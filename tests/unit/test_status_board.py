"""The live status of builds: a redrawn line on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io

from fdl_tasks.core.console import PrefixedLines, StatusBoard


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=False) as board:
        board.started("a")
        PrefixedLines("a", None, board).write("Compiling x\nFinished")
        board.finished("a", ok=True, seconds=1.25)
    text = out.getvalue()
    assert "\r" not in text and "\033" not in text
    assert text.splitlines() == ["prebuild: a started", "[a] Compiling x", "prebuild: a ok in 1.2s"]


def test_live_status_line_on_a_terminal() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=True) as board:
        board.started("a")
        board.started("b")
        PrefixedLines("a", None, board).write("Compiling x\n")
        board.finished("b", ok=False, seconds=2.0, detail="cargo exited 101")
        text = out.getvalue()
        assert "\r\033[K[a] Compiling x\n" in text  # the status line is cleared first
        assert "[running: a 0s, b 0s | done 0 | failed 0]" in text
        assert text.endswith("[running: a 0s | done 0 | failed 1]")
    assert out.getvalue().endswith("\r\033[K")  # and erased at the end


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
