"""Where to watch: the directories handed to the file watcher for a :class:`Scope`.

Pure (whether a path exists is passed in). ``target/`` and the unused libtorch
variants can hold hundreds of thousands of files: they are never walked, so
the watcher neither spends inotify watches on them nor polls them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable

import attrs

from fdl_tasks.config.variants import libtorch_root
from fdl_tasks.tree.scope import Scope, hidden, ignored_dir, under


@attrs.frozen
class WatchPlan:
    """Directories watched with their whole tree, and directories watched alone."""

    recursive: tuple[str, ...]
    flat: tuple[str, ...]


def nearest_existing(path: str, stop: str, exists: Callable[[str], bool]) -> str:
    """``path`` or its closest existing ancestor, never above ``stop``."""
    while not exists(path) and path != stop and path not in ("/", ""):
        path = posixpath.dirname(path)
    return path


def watch_plan(scope: Scope, top_dirs: Iterable[str], exists: Callable[[str], bool]) -> WatchPlan:
    """What to hand to the watcher so that ``target/`` and unused variants are never walked.

    The root alone (its files, new top-level directories), each top-level
    directory's tree, each variant's ``lib/`` tree and directory alone (or the
    closest ancestor that exists, to see it appear), and the parent directory
    of the cluster file and of each declared input outside the root.
    """
    root = scope.root
    libtorch = libtorch_root(root)
    recursive: set[str] = set()
    flat = {root}
    for name in top_dirs:
        path = posixpath.join(root, name)
        if name == "target" or ignored_dir(name) or path == libtorch or path in scope.excluded:
            continue
        recursive.add(path)
    for variant in scope.variants:
        lib = posixpath.join(variant, "lib")
        if exists(lib):
            recursive.add(lib)
            flat.add(variant)
        else:
            flat.add(nearest_existing(variant, root, exists))
    for path in (*scope.cluster_files, *scope.declared):
        if hidden(path, root) or not under(path, root):  # no watched tree holds it
            flat.add(nearest_existing(posixpath.dirname(path), "/", exists))
    flat = {f for f in flat if not any(under(f, r) for r in recursive)}
    return WatchPlan(tuple(sorted(recursive)), tuple(sorted(flat)))
