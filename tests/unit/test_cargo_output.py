"""cargo's stream cut into its bar, status lines and diagnostics (a real cargo 1.95 capture)."""

from __future__ import annotations

from fdl_tasks.build.cargo_output import (
    CargoOutput,
    Diagnostic,
    Other,
    Progress,
    StatusLine,
    is_status,
)

PAD = " " * 40
#: ``cargo build --release`` with PROGRESS_FLAGS through a pipe: two warnings replayed
#: for a fresh crate, then a syntax error.
CAPTURE = (
    "   Compiling d2 v0.1.0 (/tmp/cp-test/d2)\n"
    f"    Building [                             ] 0/4: d2{PAD}\r"
    "warning: unused variable: `x`\n"
    "  --> d1/src/lib.rs:15:13\n"
    "   |\n"
    "15 | fn f(){ let x = 1; }\n"
    "   |             ^ help: if this is intentional, prefix it with an underscore: `_x`\n"
    "\n"
    "warning: `d1` (lib) generated 1 warning\n"
    f"    Building [=============>               ] 2/4: d2, d3{PAD}\r"
    "error: expected expression, found `;`\n"
    "  --> d2/src/lib.rs:15:18\n"
    "   |\n"
    "15 | fn g() { let y = ; }\n"
    "   |                  ^ expected expression\n"
    "\n"
    "error: could not compile `d2` (lib) due to 1 previous error\n"
)


def events_of(text: str, piece: int) -> list[object]:
    """The events of ``text`` fed in pieces of ``piece`` characters, then closed."""
    cargo = CargoOutput()
    events: list[object] = []
    for start in range(0, len(text), piece):
        events += cargo.feed(text[start : start + piece])
    return events + cargo.close()


def test_a_capture_cut_into_bar_status_and_diagnostics_whatever_the_pieces() -> None:
    expected = [
        StatusLine("   Compiling d2 v0.1.0 (/tmp/cp-test/d2)"),
        Progress(0, 4, "d2"),
        Diagnostic(
            (
                "warning: unused variable: `x`",
                "  --> d1/src/lib.rs:15:13",
                "   |",
                "15 | fn f(){ let x = 1; }",
                "   |             ^ help: if this is intentional, prefix it with an underscore:"
                " `_x`",
            )
        ),
        Diagnostic(("warning: `d1` (lib) generated 1 warning",)),
        Progress(2, 4, "d2, d3"),
        Diagnostic(
            (
                "error: expected expression, found `;`",
                "  --> d2/src/lib.rs:15:18",
                "   |",
                "15 | fn g() { let y = ; }",
                "   |                  ^ expected expression",
            )
        ),
        Diagnostic(("error: could not compile `d2` (lib) due to 1 previous error",)),
    ]
    for piece in (1, 7, 64, len(CAPTURE)):
        assert events_of(CAPTURE, piece) == expected, piece


def test_other_lines_and_a_last_line_without_newline() -> None:
    text = "docker: Error response from daemon\n    Finished `release` profile\nlast"
    assert events_of(text, 5) == [
        Other("docker: Error response from daemon"),
        StatusLine("    Finished `release` profile"),
        Other("last"),
    ]


def test_status_lines_are_cargo_verbs_right_aligned_to_column_twelve() -> None:
    assert is_status("   Compiling serde v1.0.0")
    assert is_status("  Downloaded regex v1.0.0")
    assert not is_status("Compiling serde")  # not cargo's alignment
    assert not is_status("  thread 'main' panicked")


def test_finished_completes_the_bar_cargo_leaves_one_short() -> None:
    text = "    Building [===>  ] 3/4: ddp-bench\r    Finished `release` profile\n"
    assert events_of(text, 9) == [
        Progress(3, 4, "ddp-bench"),
        StatusLine("    Finished `release` profile"),
        Progress(4, 4, ""),
    ]
