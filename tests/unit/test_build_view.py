"""How builds are named and said while they run."""

from __future__ import annotations

import io

from fdl_tasks.build.build_environment import Build, BuildEnvironment, BuildJob
from fdl_tasks.build.build_view import job_labels, last_run_seconds, ran_line, result_line
from fdl_tasks.build.build_view_io import BuildView
from fdl_tasks.core.console import StatusBoard
from fdl_tasks.core.reporting import Severity, collect


def job(name: str, arch: str, *hosts: str) -> BuildJob:
    build = Build(BuildEnvironment("docker", arch, ()), "ddp-bench", "")
    return BuildJob(name, build, hosts, f"target/cluster/{name}")


CU128 = job("precompiled-cu128-aa", "precompiled/cu128", "alpha", "beta")
CPU = job("precompiled-cpu-cc", "precompiled/cpu", "gamma")


def test_a_build_is_its_variant_and_the_id_only_where_two_share_one() -> None:
    assert job_labels([CU128, CPU]) == {CU128.name: "cu128", CPU.name: "cpu"}
    other = job("precompiled-cu128-bb", "precompiled/cu128", "delta")
    assert job_labels([CU128, other])[other.name] == "cu128/bb"
    per_host = [
        job("alpha", "precompiled/cu128", "alpha"),
        job("beta", "precompiled/cu128", "beta"),
    ]
    assert list(job_labels(per_host).values()) == ["cu128/alpha", "cu128/beta"]


def test_the_log_says_how_long_cargo_ran_for_the_next_estimate() -> None:
    assert last_run_seconds(f"   Finished\n{ran_line(41.96, 0)}") == 42.0
    assert last_run_seconds(ran_line(3.0, 101)) is None  # a failed run is no estimate
    assert last_run_seconds("") is None
    assert result_line(
        "prebuild", "cpu (gamma)", ok=False, seconds=2, detail="cargo exited 101"
    ) == ("prebuild: cpu (gamma) FAILED (cargo exited 101) in 2.0s")


def test_plain_output_prefixes_lines_logs_all_but_the_bar_and_groups_errors() -> None:
    out, logs = io.StringIO(), {CU128.name: io.StringIO(), CPU.name: io.StringIO()}
    error = "error: expected expression, found `;`\n  --> src/main.rs:3:13\n\n"
    with StatusBoard(out, live=False, every=60) as board:

        def report(line: str, severity: Severity = Severity.PROGRESS, /) -> None:
            board.say(line)

        view = BuildView(board, [CU128, CPU], report, "prebuild")
        for built in (CU128, CPU):
            view.started(built, None)
        streams = {b.name: view.output(b, logs[b.name]) for b in (CU128, CPU)}
        for stream in streams.values():
            stream.write(f"   Compiling main v0.1.0\n    Building [=> ] 1/2: main\r{error}")
        for built in (CU128, CPU):
            streams[built.name].close()
            view.finished(built, ok=False, seconds=1.0, detail="cargo exited 101")
    lines = out.getvalue().splitlines()
    assert lines == [
        "prebuild: cu128 (alpha, beta) started",
        "prebuild: cpu (gamma) started",
        "[cu128]    Compiling main v0.1.0",
        "[cpu]    Compiling main v0.1.0",
        "prebuild: cu128 (alpha, beta) FAILED (cargo exited 101) in 1.0s",  # cpu's error to come
        "error in cu128, cpu: expected expression, found `;`",
        "  --> src/main.rs:3:13",
        "prebuild: cpu (gamma) FAILED (cargo exited 101) in 1.0s",
    ]
    assert logs[CPU.name].getvalue() == (
        "   Compiling main v0.1.0\nerror: expected expression, found `;`\n  --> src/main.rs:3:13\n"
    )


def test_a_stopped_run_says_what_it_held() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=False, every=60) as board:
        view = BuildView(board, [CU128, CPU], collect([]), "prebuild")
        stream = view.output(CU128, None)
        stream.write("warning: unused variable: `x`\n")
        stream.close()
        assert out.getvalue() == ""  # cpu may still give it
        view.close()
    assert out.getvalue() == "warning in cu128: unused variable: `x`\n"


def test_a_line_every_build_gives_alike_is_said_once() -> None:
    out = io.StringIO()
    with StatusBoard(out, live=False, every=60) as board:
        view = BuildView(board, [CU128, CPU], collect([]), "prebuild")
        for built in (CPU, CU128):
            stream = view.output(built, None)
            stream.write("fdl: changed by content since the last good build: src/main.rs\n")
            stream.close()
    assert out.getvalue() == (
        "[cu128, cpu] fdl: changed by content since the last good build: src/main.rs\n"
    )
