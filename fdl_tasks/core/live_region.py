"""The live region of :class:`~fdl_tasks.core.console.StatusBoard` on a terminal: rich's
progress bars, one line per running build. Imported only when there is a terminal.
"""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

from fdl_tasks.core.console import clock


class _Count(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.completed:.0f}/{task.total:.0f}" if task.total else "")


class _Clock(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(clock(task.elapsed or 0.0, task.fields.get("expected")))


def live_progress(stream: TextIO) -> Progress:
    """Each build's line: its title, a bar, units done, its clock, what cargo compiles."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        _Count(),
        _Clock(),
        TextColumn(
            "{task.fields[current]}",
            table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
        ),
        console=Console(file=stream, force_terminal=True, highlight=False),
        transient=True,
        refresh_per_second=4,
        redirect_stdout=False,  # stdout is for --json, never the terminal's region
    )
