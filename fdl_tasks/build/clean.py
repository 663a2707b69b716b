"""``inv clean``: remove the target dirs that no current host, variant or image uses.

What is live is :func:`fdl_tasks.build.build_plan.live_target_dirs`; what is stale among
what exists is :func:`fdl_tasks.config.layout.stale_dirs`. Only entries under
``target/cluster/`` are ever listed or removed, never followed through a
symbolic link, and never while a prebuild holds the project lock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import live_target_dirs
from fdl_tasks.build.parked_standbys import park_dir
from fdl_tasks.build.warm_containers_io import remove_project_containers
from fdl_tasks.config.installed_variants import expand_auto
from fdl_tasks.config.layout import CLUSTER_TARGET, LOCK_FILE, OWN_ENTRIES, WATCH_DIR, stale_dirs
from fdl_tasks.config.run import Run
from fdl_tasks.config.setting_values import size_bytes
from fdl_tasks.core.console import format_table
from fdl_tasks.core.errors import FdlError, LeftRunning
from fdl_tasks.core.locks import FileLock
from fdl_tasks.core.reporting import Severity


def tree_entries(tree: Path) -> list[str]:
    """Every entry of ``target/cluster`` and every directory one level below, relative."""
    entries = []
    for top in sorted(tree.iterdir()) if tree.is_dir() else []:
        entries.append(top.name)
        if top.is_dir() and not top.is_symlink() and top.name not in OWN_ENTRIES:
            entries += [f"{top.name}/{d.name}" for d in sorted(top.iterdir()) if d.is_dir()]
    return entries


def disk_usage(path: Path) -> int:
    """Bytes under ``path`` (symbolic links counted as themselves, never followed)."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def stale_paths(run: Run) -> list[str]:
    """Stale entries, relative to ``target/cluster``."""
    live = live_target_dirs(expand_auto(run.remotes, run.root), backend_for(run.cluster))
    return stale_dirs(tree_entries(run.root / CLUSTER_TARGET), live)


@contextlib.contextmanager
def no_prebuild_running(lock_path: Path) -> Iterator[None]:
    """Hold the project lock for the clean; refuse at once if a prebuild holds it."""
    lock = FileLock.existing(lock_path)
    if lock is None:
        yield
        return
    with lock:
        if not lock.take():
            raise FdlError(
                f"a prebuild is running on this project ({lock.holder()}): clean refuses to "
                "remove target dirs under it; try again when it has finished"
            )
        yield


def clean_target_tree(run: Run, *, list_only: bool, everything: bool) -> None:
    """Remove (or only list) stale entries, each with its size, and the total."""
    tree = run.root / CLUSTER_TARGET
    with no_prebuild_running(run.root / LOCK_FILE):
        if not list_only:
            clean_warm(run)
        if everything:  # envelopes too (they would name removed binaries); a watcher's own
            names = [p.name for p in sorted(tree.iterdir())] if tree.is_dir() else []
            kept = {Path(LOCK_FILE).name, Path(WATCH_DIR).name}  # lock and state: never
            chosen = [n for n in names if n not in kept]
        else:
            chosen = stale_paths(run)
        if not chosen:
            run.say(f"nothing to remove under {tree}")
            return
        sizes = {entry: disk_usage(tree / entry) for entry in chosen}
        for line in format_table(
            [("entry", "size"), *((f"{CLUSTER_TARGET}/{e}", human(s)) for e, s in sizes.items())]
        ):
            run.say(line)
        total = human(sum(sizes.values()))
        if list_only:
            run.say(f"{len(chosen)} entries, {total}; nothing removed (dry run)")
            return
        for entry in chosen:
            path = tree / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        run.say(f"removed {len(chosen)} entries, {total} freed")


def remove_warm(run: Run) -> list[str]:
    """The project's warm build containers removed (in a mode that has containers), and
    the standbys parked in them; what could not be, each a line naming it and the
    command that removes it."""
    if backend_for(run.cluster).mode == "native":
        return []
    left = remove_project_containers(str(run.root))
    shutil.rmtree(park_dir(str(run.root)), ignore_errors=True)
    return left


def clean_warm(run: Run) -> None:
    """``inv clean``: no warm build container of the project kept."""
    left = remove_warm(run)
    for line in left:
        run.say(f"warning: {line}", Severity.WARNING)
    if left:
        raise LeftRunning("not every warm build container could be removed:\n" + "\n".join(left))


def stale_warning(run: Run) -> None:
    """After a prebuild: one line when stale target dirs hold more than the threshold."""
    tree = run.root / CLUSTER_TARGET
    stale = stale_paths(run)
    if not stale:
        return
    size = sum(disk_usage(tree / entry) for entry in stale)
    if size > size_bytes(run.settings.stale_warning_size):
        run.say(
            f"{human(size)} in {len(stale)} target dir(s) no host uses any more; "
            "inv clean removes them (inv clean --dry lists them)"
        )
