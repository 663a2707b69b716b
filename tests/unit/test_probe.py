"""Probe script, parsing and the preflight policy (SPEC "preflight")."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import attrs
import pytest

from fdl_tasks.core.reporting import Severity
from fdl_tasks.preflight.probe import (
    ControllerAbi,
    ProbeFacts,
    ProbeRequest,
    judge,
    parse_facts,
    unreachable,
)
from fdl_tasks.preflight.probe_report import note_lines, report_lines
from fdl_tasks.preflight.unmet_versions import VariantLibraries
from tests.unit.meeting_shims import meeting_shims, met

CONTROLLER = ControllerAbi("x86_64", (2, 36))
ABI = ProbeRequest("/data", True, abi=True)


def run_locally(request: ProbeRequest) -> ProbeFacts | None:
    done = subprocess.run(["sh", "-c", request.script()], capture_output=True, text=True)
    assert done.returncode == 0
    return parse_facts(done.stdout)


def test_script_reports_this_machine(tmp_path: Path) -> None:
    facts = run_locally(ProbeRequest(str(tmp_path), True, abi=True))
    assert facts is not None
    assert facts.data == "ok"
    assert facts.cpu_arch == subprocess.check_output(["uname", "-m"], text=True).strip()
    assert facts.glibc is not None and facts.glibc >= (2, 17)
    assert facts.pkill is not None


#: ``getconf GNU_LIBC_VERSION`` on a musl host (no musl host exists here: a shim says it).
MUSL_GETCONF = "echo 'getconf: GNU_LIBC_VERSION: unknown variable' >&2; exit 1"
MUSL_LDD = "echo 'musl libc (x86_64)' >&2; echo 'Version 1.2.4' >&2; exit 1"


@pytest.mark.parametrize(
    ("getconf", "libc", "ldd_runs"),
    [
        ("echo 'glibc 2.31'", "glibc 2.31", False),
        (MUSL_GETCONF, "musl libc (x86_64) Version 1.2.4", True),
        (None, "musl libc (x86_64) Version 1.2.4", True),  # a host without getconf
    ],
)
def test_ldd_is_asked_only_when_getconf_names_no_glibc(
    tmp_path: Path, getconf: str | None, libc: str, ldd_runs: bool
) -> None:
    """glibc answers with one small program; ldd (a bash script, 4 processes) is the
    fallback, so a glibc host costs less per probe and a musl one is still found."""
    shims = {"ldd": f": > {tmp_path}/ldd-ran; {MUSL_LDD}", "getconf": getconf}
    for name, body in shims.items():
        if body is not None:
            (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
            (tmp_path / name).chmod(0o755)
    tools = [f"/usr/bin/{t}" for t in ("uname", "head", "tr")]
    (tmp_path / "bin").mkdir()
    for tool in tools:
        (tmp_path / "bin" / Path(tool).name).symlink_to(tool)
    script = ProbeRequest(str(tmp_path), True, abi=True).script()
    env = {"PATH": f"{tmp_path}:{tmp_path}/bin"}
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env)
    facts = parse_facts(done.stdout)
    assert facts is not None and facts.libc == libc, done.stdout
    assert (tmp_path / "ldd-ran").exists() == ldd_runs
    assert facts.musl == ldd_runs


def test_the_gpu_tools_run_beside_ldd_and_every_answer_comes_out_whole(tmp_path: Path) -> None:
    """``nvidia-smi`` (slow to wake a driver) and ``ldd`` on the variant's libraries run side
    by side (:mod:`tests.unit.meeting_shims`); ``ldd``'s 200 answers, more than a pipe
    writes at once, come out whole beside the GPU tool's."""
    shims, meet, lib = tmp_path / "shims", tmp_path / "meet", tmp_path / "lib"
    for folder in (shims, meet, lib):
        folder.mkdir()
    (lib / "libtorch_cpu.so").write_bytes(b"")
    unmet = "".join(
        f"{lib}/libtorch_cpu.so: /lib/libc.so.6: version `GLIBC_2.{n}' not found "
        f"(required by {lib}/libtorch_cpu.so)\n"
        for n in range(100, 300)
    )
    gpu = "0, NVIDIA GeForce GTX 1080, 6.1, 535.183.01"
    tools = {
        "nvidia-smi": ("ldd", f"echo {shlex.quote(gpu)}"),
        "ldd": ("nvidia-smi", f"printf '%s' {shlex.quote(unmet)}"),
    }
    meeting_shims(shims, meet, tools)
    variant = VariantLibraries("precompiled/cu118", str(lib), str(lib))
    request = ProbeRequest(str(tmp_path), True, abi=True, variant=variant)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "MEET": str(meet)}
    done = subprocess.run(["sh", "-c", request.script()], capture_output=True, text=True, env=env)
    assert met(meet, "nvidia-smi", "ldd")
    facts = parse_facts(done.stdout)
    assert facts is not None and facts.gpus is not None
    assert [g.name for g in facts.gpus.gpus] == ["NVIDIA GeForce GTX 1080"]
    assert [u.version for u in facts.unmet] == [f"GLIBC_2.{n}" for n in range(100, 300)]


def test_script_quotes_the_data_path(tmp_path: Path) -> None:
    hostile = tmp_path / "a dir; touch pwned $(id)"
    hostile.mkdir()
    facts = run_locally(ProbeRequest(str(hostile), True, abi=False))
    assert facts is not None and facts.data == "ok"
    assert not (Path.cwd() / "pwned").exists()
    missing = run_locally(ProbeRequest(str(tmp_path / "nope"), True, abi=False))
    assert missing is not None and missing.data == "missing"


def test_parse_ignores_banners_and_needs_both_markers() -> None:
    out = ProbeRequest("/d", False, False).script()  # for the markers only
    begin, end = out.splitlines()[0].split()[1], out.splitlines()[-2].split()[1]
    chatty = f"Welcome!\nkey=value\n{begin}\ndata=ok\ncpu_arch=aarch64\n{end}\n"
    facts = parse_facts(chatty)
    assert facts == ProbeFacts(data="ok", cpu_arch="aarch64")
    assert parse_facts(f"{begin}\ndata=ok\n") is None


@pytest.mark.parametrize(
    ("facts", "declared", "status", "fragment"),
    [
        (ProbeFacts("ok", "x86_64", "ldd (GNU libc) 2.36", True), True, "ok", ""),
        (
            ProbeFacts("missing", "x86_64", "ldd (GNU libc) 2.36", True),
            True,
            "error",
            "declared data_path /data is missing",
        ),
        (
            ProbeFacts("unreadable", "x86_64", "ldd (GNU libc) 2.36", True),
            False,
            "error",
            "not readable",
        ),
        (
            ProbeFacts("ok", "aarch64", "ldd (GNU libc) 2.36", True),
            True,
            "error",
            "aarch64 differs",
        ),
        (
            ProbeFacts("ok", "x86_64", "musl libc (x86_64) Version 1.2.4", True),
            True,
            "error",
            "musl",
        ),
        (
            ProbeFacts("ok", "x86_64", "ldd (GNU libc) 2.36", False),
            True,
            "warning",
            "pkill not found",
        ),
        (ProbeFacts("ok", None, "ldd (GNU libc) 2.36", True), True, "warning", "gave no answer"),
        (
            ProbeFacts("ok", "x86_64", "ldd (Ubuntu GLIBC 2.31-0ubuntu9) 2.31", True),
            True,
            "warning",
            "glibc 2.31 is older",
        ),
        (ProbeFacts("ok", "x86_64", "ldd (GNU libc) 2.39", True), True, "ok", ""),
        (ProbeFacts("ok", "x86_64", None, True), True, "warning", "libc not recognised"),
        (None, True, "warning", "no usable answer"),
    ],
)
def test_policy(facts: ProbeFacts | None, declared: bool, status: str, fragment: str) -> None:
    verdict = judge("h", ProbeRequest("/data", declared, abi=True), facts, CONTROLLER)
    assert verdict.status == status
    assert fragment in " ".join(verdict.errors + verdict.warnings)


def test_abi_gate_only_when_prebuilding() -> None:
    facts = ProbeFacts("ok", "aarch64", "musl libc", False)
    assert judge("h", ProbeRequest("/d", True, abi=False), facts, CONTROLLER).status == "ok"


def test_several_problems_on_one_host_are_all_reported() -> None:
    facts = ProbeFacts("unreadable", "aarch64", "musl libc (x86_64)", False)
    verdict = judge("h", ABI, facts, CONTROLLER)
    assert len(verdict.errors) == 3 and len(verdict.warnings) == 1


def test_unreachable_is_a_warning_and_report_summarises() -> None:
    verdicts = [
        judge("a", ABI, ProbeFacts("ok", "x86_64", "GNU libc 2.36", True), CONTROLLER),
        unreachable("b", ABI, "connection refused at 10.0.0.2:22"),
        judge("c", ABI, ProbeFacts("missing", "aarch64", "GNU libc 2.36", True), CONTROLLER),
    ]
    said = report_lines(verdicts)
    lines = [line for line, _ in said]
    assert said[0] == ("  ok       a", Severity.PROGRESS)
    assert "warning  b: unreachable: connection refused" in lines[1]
    assert said[1][1] is Severity.WARNING and said[2][1] is Severity.PROGRESS
    assert sum("error    c:" in line for line in lines) == 2
    assert lines[-1] == "preflight: 1 ok, 1 with warnings, 1 with errors (c)"


def test_a_missing_default_data_path_is_one_note_for_every_host() -> None:
    """Harmless without shared storage: the hosts stay ok, and one line names them all
    and how to silence it (flodl warns per host)."""
    facts = ProbeFacts("missing", "x86_64", "ldd (GNU libc) 2.36", True)
    undeclared = ProbeRequest("/flodl/data", False, abi=True)
    verdicts = [judge(h, undeclared, facts, CONTROLLER) for h in ("a", "b")]
    assert [v.status for v in verdicts] == ["ok", "ok"]
    assert verdicts[0].notes == (
        "default data_path /flodl/data is missing (fine without shared storage)",
    )
    lines = [line for line, _ in report_lines(verdicts)]
    assert lines == [
        "  note     no data_path declared, and the default /flodl/data is missing on a, b: fine "
        "without shared storage (declare data_path: on those hosts to silence this; a declared "
        "one must exist)",
        "preflight: 2 ok, 0 with warnings, 0 with errors",
    ]
    declared = judge("c", ProbeRequest("/flodl/data", True, abi=True), facts, CONTROLLER)
    assert declared.status == "error" and not declared.notes


def test_a_note_true_of_several_hosts_is_one_line_naming_them() -> None:
    """A first run on hosts without GPU tools: one note line, not one per host."""
    facts = ProbeFacts("ok", "x86_64", "ldd (GNU libc) 2.36", True)
    gpu = "GPU coverage could not be checked: no nvidia-smi on the host"
    verdicts = [
        attrs.evolve(judge(h, ABI, facts, CONTROLLER), notes=(gpu,)) for h in ("a", "b", "c")
    ]
    verdicts[2] = attrs.evolve(verdicts[2], notes=("arch: auto chose precompiled/cpu",))
    lines = [line for line, _ in report_lines(verdicts)]
    assert lines == [
        f"  note     a, b: {gpu}",
        "  note     c: arch: auto chose precompiled/cpu",
        "preflight: 3 ok, 0 with warnings, 0 with errors",
    ]


def test_a_healthy_preflight_is_its_summary_alone() -> None:
    """Every host ok: no line per host; the notes given (those not said already) only."""
    facts = ProbeFacts("ok", "x86_64", "ldd (GNU libc) 2.36", True)
    gpu = "GPU coverage could not be checked: no nvidia-smi on the host"
    verdicts = [attrs.evolve(judge(h, ABI, facts, CONTROLLER), notes=(gpu,)) for h in ("a", "b")]
    assert [line for line, _ in report_lines(verdicts, notes=[])] == [
        "preflight: 2 ok, 0 with warnings, 0 with errors"
    ]
    assert note_lines(verdicts) == [f"a, b: {gpu}"]


def test_the_script_is_shell_as_sent_and_as_inv_dry_shows_it() -> None:
    """``inv --dry`` prints the script with its lines joined by "; ": it must still parse."""
    variant = VariantLibraries("precompiled/cu118", "/p/lib", "/p/lib")
    script = ProbeRequest("/data", True, abi=True, variant=variant).script()
    for text in (script, script.replace("\n", "; ")):
        assert subprocess.run(["sh", "-n", "-c", text], capture_output=True).returncode == 0
