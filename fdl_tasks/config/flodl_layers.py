"""flodl's config layering, as ``fdl @<env>`` reads it. Pure: files are read by a callback.

A flodl project keeps ``fdl.yml`` (or ``fdl.yaml``, ``fdl.json``) at its
root and one overlay per environment beside it, ``fdl.<env>.yml``, chosen by
``@env``, ``--env`` or ``FDL_ENV``. Each file may name one parent with a
top-level ``inherit-from:``, applied before it. The layers are the base's
chain (deepest ancestor first), then the overlay's, each file once (its
first place wins), deep-merged left to right: mappings merge key by key,
anything else (lists included) is replaced whole, and a null value deletes
the key. This tool must see the cluster block flodl's launcher will see.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fdl_tasks.config.values import quote
from fdl_tasks.core.errors import FdlError, passed

#: The base file's names, in flodl's order of preference.
BASE_NAMES = ("fdl.yaml", "fdl.yml", "fdl.json")
#: An overlay's extensions, in the same order.
EXTENSIONS = ("yaml", "yml", "json")
#: The env ``fdl @cluster`` names, and ours when none is chosen.
DEFAULT_ENV = "cluster"
INHERIT_KEY = "inherit-from"
#: The variable through which flodl's users choose an env.
FLODL_ENV = "FDL_ENV"
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_OVERLAY = re.compile(r"fdl\.([^/]+)\.(?:yaml|yml|json)")

#: Reads one layer: the file's parsed data (a mapping, or None for an empty file).
Reader = Callable[[Path], Any]


def is_base(path: Path) -> bool:
    return path.name in BASE_NAMES


def overlay_env(path: Path) -> str | None:
    """The env an ``fdl.<env>.yml`` overlay is for; ``None`` for any other name."""
    match = _OVERLAY.fullmatch(path.name)
    return match.group(1) if match and path.name not in BASE_NAMES else None


def is_layer(path: Path) -> bool:
    """Named as one of flodl's config files: a base or an env overlay."""
    return is_base(path) or overlay_env(path) is not None


def check_env(env: str) -> str:
    rule = "letters, digits, '.', '_' and '-'"
    why = f"env {quote(env)} is not a name flodl can load (fdl.<env>.yml): {rule}"
    return passed(env, _ENV_NAME.fullmatch, lambda: FdlError(why))


def first_existing(
    directory: Path, names: tuple[str, ...], exists: Callable[[Path], bool]
) -> Path | None:
    return next((directory / n for n in names if exists(directory / n)), None)


def overlay_names(env: str) -> tuple[str, ...]:
    return tuple(f"fdl.{env}.{extension}" for extension in EXTENSIONS)


def deep_merge(base: Any, overlay: Any) -> Any:
    """flodl's merge: mapping into mapping key by key (a null deletes), else replaced."""
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return overlay
    merged = dict(base)
    for key, value in overlay.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = deep_merge(merged.pop(key), value)
        else:
            merged[key] = value
    return merged


def parent_of(declaring: Path, value: object, home: str) -> Path | None:
    """The file an ``inherit-from:`` names: ``~/`` is the user's home, a relative path is
    relative to the declaring file's directory; remote parents are refused."""
    if value is None:
        return None
    where = f"{declaring}: {INHERIT_KEY}"
    if not isinstance(value, str):
        raise FdlError(f"{where} must be a path, got {type(value).__name__}")
    if not value.strip():
        raise FdlError(f"{where} must be a non-empty path")
    if "://" in value:
        raise FdlError(f"{where} {quote(value)}: remote parents are not supported")
    if value.startswith("~/"):
        return Path(home) / value[2:]
    return Path(posixpath.normpath(declaring.parent / value))


def chain(start: Path, read: Reader, home: str) -> list[tuple[Path, Any]]:
    """``start`` and its ``inherit-from`` ancestors, deepest first, each with its data
    (the key taken out)."""
    seen: list[Path] = []
    layers: list[tuple[Path, Any]] = []
    path: Path | None = start
    while path is not None:
        if path in seen:
            loop = " -> ".join(str(p) for p in [*seen, path])
            raise FdlError(f"inherit-from cycle detected: {loop}")
        seen.append(path)
        data = read(path)
        parent = None
        if isinstance(data, dict) and INHERIT_KEY in data:
            data = dict(data)
            parent = parent_of(path, data.pop(INHERIT_KEY), home)
        layers.insert(0, (path, data))
        path = parent
    return layers


def project_layers(
    base: Path | None, overlay: Path | None, read: Reader, home: str
) -> list[tuple[Path, Any]]:
    """Every layer of a project, in merge order: the base's chain, then the overlay's,
    each file at its first place."""
    layers: list[tuple[Path, Any]] = []
    for start in (base, overlay):
        if start is not None:
            layers += [(p, d) for p, d in chain(start, read, home) if p not in dict(layers)]
    return layers


def merged(layers: list[tuple[Path, Any]]) -> Any:
    """Every layer merged into the one before (the first taken as it is)."""
    return functools.reduce(deep_merge, [data for _, data in layers], None)


def holding(layers: list[tuple[Path, Any]], keys: tuple[str | int, ...]) -> Path:
    """The last layer that sets ``keys`` (the deepest prefix of it that one sets), for a
    message that names the file to edit."""
    for depth in range(len(keys), 0, -1):
        for path, data in reversed(layers):
            if _has(data, keys[:depth]):
                return Path(path)
    return Path(layers[-1][0])


def _has(data: Any, keys: tuple[str | int, ...]) -> bool:
    for key in keys:
        named = isinstance(data, Mapping) and isinstance(key, str) and key in data
        if not (named or (isinstance(data, list) and isinstance(key, int) and key < len(data))):
            return False
        data = data[key]
    return True
