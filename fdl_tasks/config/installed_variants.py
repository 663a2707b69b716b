"""The libtorch variants installed on the controller, as its own disk shows them.

Read without any probe: ``arch: auto`` chooses among them, ``inv clean`` and
the watcher keep every one of them live for an ``auto`` worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.values import InvalidValue, check_arch
from fdl_tasks.config.variants import libtorch_dir, libtorch_root
from fdl_tasks.core.binary_files import file_machine
from fdl_tasks.gpu.auto_arch import AUTO, Installed
from fdl_tasks.gpu.coverage import ArchFile, parse_arch_file

#: The metadata file flodl writes next to a variant's ``lib/``.
ARCH_FILE = ".arch"


def read_arch_file(root: Path, arch: str) -> ArchFile | None:
    """The variant's ``.arch``, ``None`` when it has none (or it cannot be read)."""
    try:
        text = (Path(libtorch_dir(str(root), arch)) / ARCH_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_arch_file(text)


def installed_variants(root: Path) -> list[Installed]:
    """``libtorch/precompiled/*`` and ``libtorch/builds/*`` with a ``lib/``, by name."""
    found = []
    for family in ("precompiled", "builds"):
        directory = Path(libtorch_root(str(root))) / family
        try:
            children = sorted(directory.iterdir()) if directory.is_dir() else []
        except OSError:  # an unreadable family offers no candidate (auto then says none fit)
            children = []
        for child in children:
            arch = f"{family}/{child.name}"
            try:
                check_arch(arch)
            except InvalidValue:
                continue
            if (child / "lib").is_dir():
                cpu = file_machine(child / "lib" / "libtorch.so")
                found.append(Installed(arch, read_arch_file(root, arch), cpu))
    return found


def expand_auto(workers: Sequence[Worker], root: Path) -> list[Worker]:
    """Each ``arch: auto`` worker once per installed variant (what ``inv clean`` keeps
    live: without a probe, any of them may be the host's); other workers as they are."""
    variants = [item.arch for item in installed_variants(root)]
    return [attrs.evolve(w, arch=arch) for w in workers for arch in variants if w.arch == AUTO] + [
        w for w in workers if w.arch != AUTO
    ]
