"""Messages that carry structure: the cluster file actually read, and a line's severity."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from invoke.context import Context

from fdl_tasks.config.loader import load_cluster, parse_cluster
from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Severity
from fdl_tasks.watch.session import Session

MINIMAL = {"controller": {"path": "/srv/proj"}, "workers": [{"host": "a", "path": "/srv/proj"}]}


def test_messages_name_the_cluster_file_that_was_read(tmp_path: Path) -> None:
    path = tmp_path / "my-cluster.yml"
    path.write_text("controller: {path: /srv/proj}\nworkers: [{host: a, path: /srv/proj}]\n")
    cluster = load_cluster(path)
    assert cluster.source == str(path)
    with pytest.raises(FdlError, match=f"{path} declares a$"):
        cluster.worker("b")


def test_the_source_is_never_read_from_the_file() -> None:
    with pytest.raises(FdlError) as refused:
        parse_cluster({**MINIMAL, "source": "elsewhere.yml"}, "c.yml")
    assert "unknown key(s) source; expected one of: controller, workers" in str(refused.value)
    assert "source." not in str(refused.value).split("expected one of:")[1]


def test_a_quiet_cycle_holds_progress_back_and_shows_warnings_and_waits() -> None:
    shown: list[tuple[str, Severity]] = []
    run = Run(
        Context(),
        parse_cluster(MINIMAL, "c.yml"),
        "a",
        Settings(),
        report=lambda line, severity=Severity.PROGRESS, /: shown.append((line, severity)),
    )
    held: list[str] = []
    quiet = Session.quiet_run(SimpleNamespace(run=run), held)  # type: ignore[arg-type]
    quiet.say("3 build(s) with docker run")
    quiet.say("warning: a host is unreachable", Severity.WARNING)
    quiet.report("prebuild: waiting for the lock", Severity.WAIT)
    assert held == ["prebuild: 3 build(s) with docker run"]
    assert shown == [
        ("prebuild: warning: a host is unreachable", Severity.WARNING),
        ("prebuild: waiting for the lock", Severity.WAIT),
    ]
