"""Where fdl-tasks remembers things between runs for the user: one directory per kind
under ``$XDG_CACHE_HOME/fdl-tasks`` (else ``~/.cache/fdl-tasks``), one JSON file per key.

Everything kept there is a cache: a missing, stale or damaged file costs time, never
a wrong result, and it is read and written without complaint.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_home() -> str:
    """The user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


def cache_file(home: str, kind: str, key: str) -> Path:
    """The file that remembers ``key`` (a path, a command line) among those of ``kind``."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(home) / "fdl-tasks" / kind / f"{digest}.json"
