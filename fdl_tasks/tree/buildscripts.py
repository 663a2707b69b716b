"""What build scripts declare: ``cargo:rerun-if-changed`` paths, in the controller's view.

Pure: the texts of the ``output`` files come in, paths go out. cargo reruns a
build script when a declared path changes, or, when it declares nothing, when
any file of its package does; the watcher counts the same changes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence

from fdl_tasks.tree.scope import under

RERUN_PREFIXES = ("cargo:rerun-if-changed=", "cargo::rerun-if-changed=")


def rerun_declarations(output: str) -> list[str]:
    """The paths a build script's ``output`` file declares with ``rerun-if-changed``."""
    found = []
    for line in output.splitlines():
        for prefix in RERUN_PREFIXES:
            if line.startswith(prefix) and line[len(prefix) :].strip():
                found.append(line[len(prefix) :].strip())
    return found


def host_path(path: str, mounts: Sequence[tuple[str, str | None]]) -> str | None:
    """A path a build saw inside its container, in the controller's view.

    ``mounts``: (container path, controller path, or ``None`` for a mount that is
    watched otherwise, such as the libtorch variant). Other paths are returned as
    they are: a native build's, or a container's own (the caller drops those
    that do not exist here).
    """
    for inside, outside in mounts:
        if under(path, inside):
            if outside is None:
                return None
            return posixpath.normpath(outside + "/" + path[len(inside) :].lstrip("/"))
    return posixpath.normpath(path)


def declared_inputs(
    outputs: Iterable[tuple[str, str]],
    packages: Mapping[str, Sequence[str]],
    mounts: Sequence[tuple[str, str | None]] = (),
) -> tuple[list[str], list[str]]:
    """(declared paths, package dirs whose build script declares nothing).

    ``outputs``: (package name, text of its build script's ``output`` file);
    ``packages``: package name → its directories in the workspace (a relative
    declaration is relative to the package). Packages not in the workspace
    (registry crates) only contribute their absolute declarations.
    """
    declared: list[str] = []
    whole: list[str] = []
    for name, text in outputs:
        paths = rerun_declarations(text)
        dirs = packages.get(name, ())
        if not paths:
            whole += dirs
            continue
        for raw in paths:
            if raw.startswith("/"):
                if (mapped := host_path(raw, mounts)) is not None:
                    declared.append(mapped)
            else:
                declared += [posixpath.normpath(posixpath.join(d, raw)) for d in dirs]
    return sorted(set(declared)), sorted(set(whole))
