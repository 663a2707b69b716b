"""What counts as a change: the watched paths of a workspace and why each matters.

Pure: plain absolute path text, no file system access, so the watcher and
``inv launch`` (which reads the scope back from the watcher's state file)
classify a path the same way.
"""

from __future__ import annotations

import enum
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

#: Directory names never watched anywhere in the workspace (hidden ones neither,
#: except ``.cargo``): version control and tool caches.
IGNORED_DIRS = frozenset(
    {".git", ".hg", ".svn", ".jj", "__pycache__", "node_modules", ".venv", ".mypy_cache"}
)
MANIFESTS = frozenset({"Cargo.toml", "Cargo.lock"})
#: rustup's files pinning the Rust release a project builds with.
RUST_RELEASE_FILES = frozenset({"rust-toolchain", "rust-toolchain.toml"})
CARGO_CONFIGS = frozenset({"config", "config.toml"})


class ChangeKind(enum.Enum):
    """Why a changed path matters."""

    SOURCE = "source"
    MANIFEST = "manifest"
    BUILD_CONFIG = "build config"
    DECLARED = "build script input"
    LIBTORCH = "libtorch"
    CLUSTER = "cluster file"


def under(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or inside it (plain path text, no file system access)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def ignored_dir(name: str) -> bool:
    """A directory no build reads: version control, tool caches, hidden ones but ``.cargo``."""
    return name in IGNORED_DIRS or (name.startswith(".") and name != ".cargo")


def hidden(path: str, root: str) -> bool:
    """``path`` lies below an ignored directory of ``root`` (so no walk of it sees it)."""
    if not under(path, root) or path == root:
        return False
    return any(ignored_dir(part) for part in posixpath.relpath(path, root).split("/")[:-1])


#: ``sed -i``'s temporary file (``sedNk0P9y``): written beside the file, renamed over it.
_SED_TEMP = re.compile(r"sed[A-Za-z0-9]{6}")


def _scratch_file(name: str) -> bool:
    """Editors' temporary, swap, backup and lock files (``sedNk0P9y``, ``.#main.rs``,
    ``#main.rs#``, ``main.rs~``, ``.main.rs.swp``, vim's ``4913``): a save writes and
    removes them, and no build reads them."""
    return (
        name.startswith(".")
        or name.endswith(("~", ".swp", ".swo", ".swx", ".tmp", ".log"))
        or (name.startswith("#") and name.endswith("#"))
        or "___jb_" in name
        or name == "4913"
        or _SED_TEMP.fullmatch(name) is not None
    )


@attrs.frozen
class Scope:
    """What a watcher watches, as plain absolute paths; JSON-able for launch."""

    root: str
    #: Every file the cluster was read from (flodl's layers, ``fdl-tasks.yml``).
    cluster_files: tuple[str, ...]
    #: ``<root>/libtorch/<arch>`` of every build.
    variants: tuple[str, ...] = ()
    #: Target dirs and the tool's own files: never a change.
    excluded: tuple[str, ...] = ()
    #: ``rerun-if-changed`` files and directories.
    declared: tuple[str, ...] = ()
    #: Packages whose build script declares nothing: any file of theirs counts.
    packages: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return posixpath.join(self.root, "target")

    def classify(self, path: str) -> ChangeKind | None:
        """Why a change of ``path`` needs a cycle, or ``None`` when it does not."""
        path = posixpath.normpath(path)
        if path in self.cluster_files:
            return ChangeKind.CLUSTER
        if under(path, self.target) or any(under(path, d) for d in self.excluded):
            return None
        if any(under(path, v) for v in self.variants):
            return ChangeKind.LIBTORCH
        if path in self.declared:  # named by a build script: whatever its name
            return ChangeKind.DECLARED
        if hidden(path, self.root):
            return None
        name = posixpath.basename(path)
        if _scratch_file(name):
            return None
        if any(under(path, d) for d in self.declared):
            return ChangeKind.DECLARED
        if not under(path, self.root):
            return None
        if name in MANIFESTS:
            return ChangeKind.MANIFEST
        if name.endswith(".rs"):
            return ChangeKind.SOURCE
        if name in RUST_RELEASE_FILES or (
            name in CARGO_CONFIGS and posixpath.basename(posixpath.dirname(path)) == ".cargo"
        ):
            return ChangeKind.BUILD_CONFIG
        if any(under(path, d) for d in self.packages):
            return ChangeKind.DECLARED
        return None

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scope:
        """The scope a watcher wrote; :class:`ValueError` when a field is missing or wrong."""

        def strings(key: str) -> tuple[str, ...]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(key)
            return tuple(value)

        root = data.get("root")
        if not isinstance(root, str) or "cluster_files" not in data:
            raise ValueError("root")
        lists = ("cluster_files", "variants", "excluded", "declared", "packages")
        return cls(root, *map(strings, lists))


def gone_directory(scope: Scope, path: str) -> ChangeKind | None:
    """A removed path without a suffix may have been a directory of sources (moved away
    whole, it sends no event per file): it counts when a source inside it would. An
    editor's temporary file renamed away (``sedNk0P9y``, ``4913``) is no directory."""
    name = posixpath.basename(path.rstrip("/"))
    if "." in name or _scratch_file(name):
        return None
    return ChangeKind.SOURCE if scope.classify(posixpath.join(path, "lib.rs")) else None


def make_scope(
    root: str,
    cluster_files: Iterable[str],
    variants: Iterable[str],
    package_dirs: Iterable[str] = (),
    declared: Iterable[str] = (),
    whole_packages: Iterable[str] = (),
    own: Iterable[str] = (),
) -> Scope:
    """A scope: every package's ``target/`` excluded, declarations under a target dropped."""
    root = posixpath.normpath(root)
    excluded = {posixpath.join(root, "target")}
    excluded |= {posixpath.join(posixpath.normpath(d), "target") for d in package_dirs}
    excluded |= {posixpath.normpath(p) for p in own}
    kept = sorted(
        {p for p in declared if not any(under(p, e) for e in excluded)} - {posixpath.normpath(root)}
    )
    return Scope(
        root,
        tuple(posixpath.normpath(f) for f in cluster_files),
        tuple(sorted({posixpath.normpath(v) for v in variants})),
        tuple(sorted(excluded)),
        tuple(kept),
        tuple(sorted(set(whole_packages))),
    )
