"""Preflight's report: one line per problem per host, one per note shared by hosts,
then the summary."""

from __future__ import annotations

from collections.abc import Iterable

from fdl_tasks.probe import Status, Verdict, default_data_note
from fdl_tasks.reporting import Severity


def report_lines(verdicts: Iterable[Verdict]) -> list[tuple[str, Severity]]:
    """One line per problem, per host (a warning's at once, even in a quiet watch cycle);
    then a summary line."""
    lines: list[tuple[str, Severity]] = []
    counts: dict[Status, list[str]] = {"ok": [], "warning": [], "error": []}
    without_data: dict[str, list[str]] = {}
    for verdict in verdicts:
        counts[verdict.status].append(verdict.host)
        where = f"{verdict.host} (controller, local)" if verdict.local else verdict.host
        problems = [f"error: {e}" for e in verdict.errors] + [
            f"warning: {w}" for w in verdict.warnings
        ]
        default = default_data_note(verdict.data_path)
        if default in verdict.notes:
            without_data.setdefault(verdict.data_path, []).append(verdict.host)
        notes = [f"note: {n}" for n in verdict.notes if n != default]
        if not problems:
            lines.append((f"  ok       {where}", Severity.PROGRESS))
        for problem in problems + notes:
            label, text = problem.split(": ", 1)
            severity = Severity.WARNING if label == "warning" else Severity.PROGRESS
            lines.append((f"  {label:<8} {where}: {text}", severity))
    for path, hosts in without_data.items():
        line = (
            f"  note     no data_path declared, and the default {path} is missing on "
            f"{', '.join(hosts)}: fine without shared storage (declare data_path: on those "
            "hosts to silence this; a declared one must exist)"
        )
        lines.append((line, Severity.PROGRESS))
    summary = (
        f"preflight: {len(counts['ok'])} ok, {len(counts['warning'])} with warnings, "
        f"{len(counts['error'])} with errors"
    )
    if counts["error"]:
        summary += f" ({', '.join(counts['error'])})"
    lines.append((summary, Severity.WARNING if counts["warning"] else Severity.PROGRESS))
    return lines
