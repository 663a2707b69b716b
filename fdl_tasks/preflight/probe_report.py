"""Preflight's report: one line per problem per host, one per note shared by hosts,
then the summary; a line per healthy host only beside a problem."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fdl_tasks.core.reporting import Severity
from fdl_tasks.preflight.probe import HostVerdict, Status, default_data_note


def report_lines(
    verdicts: Iterable[HostVerdict], notes: Sequence[str] | None = None
) -> list[tuple[str, Severity]]:
    """One line per problem, per host (a warning's at once, even in a quiet watch cycle);
    ``notes`` (default: every one of :func:`note_lines`); then a summary line. Every host
    ok: the summary alone says so, with no line per host."""
    verdicts = list(verdicts)
    lines: list[tuple[str, Severity]] = []
    counts: dict[Status, list[str]] = {"ok": [], "warning": [], "error": []}
    healthy = all(not v.errors and not v.warnings for v in verdicts)
    for verdict in verdicts:
        counts[verdict.status].append(verdict.host)
        where = f"{verdict.host} (controller, local)" if verdict.local else verdict.host
        if not verdict.errors and not verdict.warnings and not healthy:
            lines.append((f"  ok       {where}", Severity.PROGRESS))
        lines += [(f"  error    {where}: {e}", Severity.PROGRESS) for e in verdict.errors]
        lines += [(f"  warning  {where}: {w}", Severity.WARNING) for w in verdict.warnings]
    said = note_lines(verdicts) if notes is None else notes
    lines += [(f"  note     {note}", Severity.PROGRESS) for note in said]
    summary = (
        f"preflight: {len(counts['ok'])} ok, {len(counts['warning'])} with warnings, "
        f"{len(counts['error'])} with errors"
    )
    if counts["error"]:
        summary += f" ({', '.join(counts['error'])})"
    lines.append((summary, Severity.WARNING if counts["warning"] else Severity.PROGRESS))
    return lines


def note_lines(verdicts: Iterable[HostVerdict]) -> list[str]:
    """One note per fact, naming every host it is true of."""
    shared: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}  # the missing-default-data-path notes, with their path
    for verdict in verdicts:
        for note in verdict.notes:
            shared.setdefault(note, []).append(verdict.host)
        if default_data_note(verdict.data_path) in verdict.notes:
            defaults[default_data_note(verdict.data_path)] = verdict.data_path
    return [_note_line(note, hosts, defaults.get(note)) for note, hosts in shared.items()]


def _note_line(note: str, hosts: list[str], default_path: str | None) -> str:
    """A note said once for the hosts it is true of; the missing default data path
    (``default_path``) with the way to silence it."""
    if default_path is not None:
        return (
            f"no data_path declared, and the default {default_path} is missing on "
            f"{', '.join(hosts)}: fine without shared storage (declare data_path: on those "
            "hosts to silence this; a declared one must exist)"
        )
    return f"{', '.join(hosts)}: {note}"
