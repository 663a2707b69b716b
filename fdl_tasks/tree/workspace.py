"""The workspace on disk, as the watcher sees it: its files, packages and build outputs.

Walks skip ``target/``, ignored directories and ``<root>/libtorch`` (variants
are read on their own), as the watcher does: a walk must not cost what the
watch plan saves.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from fdl_tasks.config.installed_variants import expand_auto
from fdl_tasks.config.layout import PROFILE_DIR
from fdl_tasks.config.run import Run
from fdl_tasks.config.variants import libtorch_dir, libtorch_root
from fdl_tasks.tree.buildscripts import declared_inputs
from fdl_tasks.tree.scope import Scope, ignored_dir, make_scope, under
from fdl_tasks.tree.snapshot import RACY_NS


def walk_files(top: str, root: str) -> Iterator[str]:
    """Files under ``top`` in the workspace rooted at ``root`` (lazily: a caller may stop
    early); a ``target/`` is skipped at the root or beside a ``Cargo.toml``."""
    libtorch = libtorch_root(root)
    for directory, dirs, files in os.walk(top):
        manifest = "Cargo.toml" in files or directory == root
        dirs[:] = [
            d
            for d in dirs
            if not ignored_dir(d)
            and not (d == "target" and manifest)
            and posixpath.join(directory, d) != libtorch
        ]
        yield from (posixpath.join(directory, name) for name in files)


def scope_files(scope: Scope) -> Iterator[str]:
    """Every file the scope can count, found on disk."""
    yield from walk_files(scope.root, scope.root)
    for variant in scope.variants:
        with contextlib.suppress(OSError):
            yield from (e.path for e in os.scandir(variant) if e.is_file())
        yield from walk_files(posixpath.join(variant, "lib"), scope.root)
    yield from scope.cluster_files
    for path in scope.declared:
        yield path  # a hidden one inside the root too (the walk skips those)
        if not under(path, scope.root) and os.path.isdir(path):
            with contextlib.suppress(OSError):
                yield from (e.path for e in os.scandir(path) if e.is_file())


#: Each manifest's package name as last parsed, by path, with the stat it was parsed at.
_NAMES: dict[str, tuple[tuple[int, ...], str | None]] = {}


def package_dirs(root: str) -> dict[str, list[str]]:
    """Package name → its directories, from every ``Cargo.toml`` of the workspace
    (each build's record asks: a manifest is parsed again only when its stat moved, or
    while it is too recent to trust, :data:`~fdl_tasks.tree.snapshot.RACY_NS`)."""
    found: dict[str, list[str]] = {}
    for path in walk_files(root, root):
        if posixpath.basename(path) == "Cargo.toml" and (name := _package_name(path)):
            found.setdefault(name, []).append(posixpath.dirname(path))
    return found


def _package_name(manifest: str) -> str | None:
    try:
        st = os.stat(manifest)
    except OSError:
        return None
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    cached = _NAMES.get(manifest)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with open(manifest, "rb") as file:
            package = tomllib.load(file).get("package")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    name = package.get("name") if isinstance(package, dict) else None
    name = name if isinstance(name, str) else None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:  # a stat to trust
        _NAMES[manifest] = (key, name)
    return name


def build_outputs(
    root: Path, target_dirs: Iterable[tuple[str, str | None]]
) -> list[tuple[str, str]]:
    """(package name, text) of every build script ``output`` in these target dirs.

    ``target_dirs``: (target dir relative to the root, Rust target triple of a cross build).
    """
    outputs = []
    for target_dir, triple in target_dirs:
        build = root / target_dir / (triple or "") / PROFILE_DIR / "build"
        for output in sorted(build.glob("*/output")):
            with contextlib.suppress(OSError):
                name = output.parent.name.rsplit("-", 1)[0]
                outputs.append((name, output.read_text(encoding="utf-8", errors="replace")))
    return outputs


def survey(
    run: Run,
    packages: Mapping[str, Sequence[str]],
    target_dirs: Iterable[tuple[str, str | None]],
    watch_dir: Path,
    mounts: Sequence[tuple[str, str | None]],
) -> Scope:
    """The scope from the cluster file, the packages and the last builds' script outputs
    (``mounts``: the backend's, to map container paths back); the watcher's own directory
    and the compile cache are never a change."""
    root = posixpath.normpath(str(run.root))
    # An auto host may get any installed variant at the next cycle's probe: watch them all.
    archs = {w.arch for w in expand_auto(run.remotes, run.root) if w.arch}
    outputs = build_outputs(run.root, target_dirs)
    declared, whole = declared_inputs(outputs, packages, mounts)
    declared = [p for p in declared if under(p, root) or os.path.exists(p)]
    dirs = [d for found in packages.values() for d in found]
    own = [str(watch_dir)]
    if cache := run.settings.compile_cache_dir:
        own.append(os.path.abspath(os.path.expanduser(cache)))
    variants = [libtorch_dir(root, arch) for arch in archs]
    files = [os.path.abspath(f) for f in run.cluster.files]
    return make_scope(root, files, variants, dirs, declared, whole, own)
