"""What cargo and rustc leave in a target dir about what a build read: parsed, no I/O.

rustc's dep-info files list the sources of each unit; a build script's run
fingerprint lists the paths it declared with ``rerun-if-changed``. The build
record reads both to know which files a binary was built from.
"""

from __future__ import annotations

import json
import re
from typing import Any


def dep_info_paths(text: str) -> list[str]:
    """The files a makefile-style dep-info file (rustc's ``deps/*.d``, cargo's
    ``release/<bin>.d``) lists, once each (a space inside a path is ``\\ ``)."""
    paths: dict[str, None] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue  # rustc's env-dep and checksum comments
        target, colon, deps = line.partition(": ")
        if colon and target:
            words = re.split(r"(?<!\\) ", deps)
            paths.update((w.replace("\\ ", " "), None) for w in words if w)
    return list(paths)


def rerun_paths(fingerprint: str) -> list[str] | None:
    """The paths a build script's run fingerprint (``run-build-script-*.json``) declared
    with ``rerun-if-changed``, as cargo saw them (relative: to the package's directory);
    ``None`` when it declared none, so that cargo reruns it on any file of its package."""
    try:
        data: Any = json.loads(fingerprint)
        local = data.get("local") if isinstance(data, dict) else None
    except ValueError:
        return []
    if not isinstance(local, list):
        return []
    paths: list[str] = []
    declared = False
    for item in local:
        if isinstance(item, dict) and isinstance(item.get("RerunIfChanged"), dict):
            found = item["RerunIfChanged"].get("paths")
            declared = True
            paths += [p for p in found if isinstance(p, str)] if isinstance(found, list) else []
        elif isinstance(item, dict) and "RerunIfEnvChanged" in item:
            declared = True
    return paths if declared else None
