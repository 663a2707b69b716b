"""What each hashed known_hosts name was found to be, kept in the user's cache between runs.

One JSON file per known_hosts file, under ``$XDG_CACHE_HOME/fdl-tasks/known-hosts``
(else ``~/.cache``): ``{"names": {"|1|salt|hmac": "host", ...}}``. It only
saves HMACs: :class:`~fdl_tasks.ssh.hashed_names.HashedNames` proves every
remembered name again before using it, so a missing, stale or damaged cache
costs time, never a wrong match; it is read and written without complaint.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.user_cache import cache_file, cache_home


def names_file(known_hosts: Path) -> Path:
    """Where the names of that known_hosts file are remembered."""
    return cache_file(cache_home(), "known-hosts", str(known_hosts.absolute()))


def read_names(known_hosts: Path) -> dict[str, str]:
    """The names remembered for that file; none if there is no usable cache."""
    try:
        names = json.loads(names_file(known_hosts).read_text(encoding="utf-8"))["names"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(names, dict):
        return {}
    return {k: v for k, v in names.items() if isinstance(k, str) and isinstance(v, str)}


def write_names(known_hosts: Path, names: dict[str, str]) -> None:
    """Remember these names for that file (a cache: a failure to write is no error)."""
    path = names_file(known_hosts)
    with contextlib.suppress(OSError, FdlError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"names": names}, sort_keys=True) + "\n")
