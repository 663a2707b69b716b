"""Whether a published binary is still what its sources say: the envelope's sidecar.

At publication, each host's entry names the build record of its binary and the
digest of the tree it was built from; ``inv launch`` reads them back and walks
only what those builds read, so a binary built from sources changed since (on a
mount with whole-second times, or after ``rsync -t``) is refused before it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fdl_tasks.build.build_record import VERSION, first_changed, named, reused_digest, tree_digest
from fdl_tasks.build.build_results import JobResult
from fdl_tasks.build.record_files import read_record, record_file
from fdl_tasks.config.layout import sources_file
from fdl_tasks.core.atomic_files import text_or_empty, write_atomically
from fdl_tasks.core.errors import FdlError
from fdl_tasks.tree.roots import WatchPlan
from fdl_tasks.tree.scan import scan
from fdl_tasks.tree.scope import Scope, under


def sources_json(sources: Mapping[str, tuple[str, str]]) -> str:
    """The envelope's sidecar: each host's record (relative to the project root) and the
    digest of the tree its binary was built from."""
    hosts = {host: {"record": record, "tree": tree} for host, (record, tree) in sources.items()}
    return json.dumps({"version": VERSION, "hosts": dict(sorted(hosts.items()))}, indent=1)


def read_sources(text: str) -> dict[str, tuple[str, str]]:
    """What :func:`sources_json` wrote; nothing for anything else (a host without its
    sources cannot be checked, and launches)."""
    try:
        data: Any = json.loads(text)
        hosts = data["hosts"] if data.get("version") == VERSION else {}
        return {
            host: (entry["record"], entry["tree"])
            for host, entry in hosts.items()
            if isinstance(entry.get("record"), str) and isinstance(entry.get("tree"), str)
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_sources(root: Path, command: str, results: Sequence[JobResult], kept: set[str]) -> None:
    """Beside the envelope just published: the record and tree digest of each host's
    binary (the hosts in ``kept`` keep their entries: their binaries did not change)."""
    path = root / sources_file(command)
    sources = {h: e for h, e in read_sources(text_or_empty(path)).items() if h in kept}
    for result in results:
        if result.tree:
            relative = str(record_file(root, result.job).relative_to(root))
            sources |= dict.fromkeys(result.job.hosts, (relative, result.tree))
    with contextlib.suppress(FdlError):  # without it, launch cannot check: it launches
        write_atomically(path, sources_json(sources) + "\n")


def stale_binary(root: Path, command: str, hosts: Sequence[str]) -> str | None:
    """Why a host's published binary of ``command`` is not what its sources say now (the
    first file found changed since it was built), or ``None``. A host the sidecar does
    not name (published before it existed) is not checked."""
    sources = read_sources(text_or_empty(root / sources_file(command)))
    checked: dict[str, str | None] = {}
    for host in hosts:
        if host not in sources:
            continue
        record_path, tree = sources[host]
        if record_path not in checked:
            checked[record_path] = _staleness(root, record_path, tree)
        if (why := checked[record_path]) is not None:
            return (
                f"{host}'s binary of {command} {why}: run inv prebuild --cmd {command} "
                "(or launch it anyway with --stale-ok)"
            )
    return None


def _staleness(root: Path, record_path: str, tree: str) -> str | None:
    """How the binary recorded in ``record_path`` differs from its sources now."""
    record = read_record(root / record_path)
    if record is None or tree_digest(record) != tree:
        return "was built from other sources than its target dir's last build"
    reads = named(record.units)
    trees = tuple(sorted(p for p in reads if os.path.isdir(p)))
    flat = tuple(sorted({posixpath.dirname(p) for p in reads} - set(trees)))
    top = posixpath.normpath(str(root))
    scope = Scope(top, (), excluded=(posixpath.join(top, "target"),))

    def counts(path: str) -> bool:
        return path in reads or any(under(path, t) for t in trees)

    look = scan(WatchPlan(trees, flat), scope, record.look, time.time_ns(), counts, reused_digest)
    changed = first_changed(record, look)
    if changed is None:
        return None
    shown = os.path.relpath(changed, top) if under(changed, top) else changed
    return f"was built before {shown} changed"
