"""The GPU gate of preflight: each host's GPUs against its variant's ``.arch``.

The thin I/O layer over :mod:`fdl_tasks.coverage`: it reads each variant's
``.arch`` on the controller (``<controller.path>/libtorch/<arch>/.arch``) and
folds the coverage verdict into the host's preflight verdict, before any build.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from fdl_tasks.coverage import ArchFile, judge_coverage, parse_arch_file
from fdl_tasks.gpus import unknown_name_warning, vendor_of
from fdl_tasks.model import Worker
from fdl_tasks.probe import Status, Verdict

#: The metadata file flodl writes next to a variant's ``lib/``.
ARCH_FILE = ".arch"


def read_arch_file(root: Path, arch: str) -> ArchFile | None:
    """The variant's ``.arch``, ``None`` when it has none (or it cannot be read)."""
    try:
        text = (root / "libtorch" / arch / ARCH_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_arch_file(text)


def gate(verdict: Verdict, worker: Worker, root: Path) -> Verdict:
    """The verdict with the host's GPU errors, warnings and notes added.

    A host that gave no answer, was not asked about GPUs, or has no arch is left as it is.
    """
    facts = verdict.facts
    if worker.arch is None or facts is None or facts.data is None or facts.gpus is None:
        return verdict
    warnings = list(verdict.warnings)
    naming = None if worker.features is not None else unknown_name_warning(worker.arch)
    if naming:
        warnings.append(naming)
    vendor = vendor_of(worker.arch, worker.features)
    info = read_arch_file(root, worker.arch) if vendor != "cpu" else None
    coverage = judge_coverage(worker.arch, vendor, facts.gpus, info)
    errors = (*verdict.errors, *coverage.errors)
    warnings += coverage.warnings
    status: Status = "error" if errors else "warning" if warnings else verdict.status
    return attrs.evolve(
        verdict,
        status=status,
        errors=errors,
        warnings=tuple(warnings),
        notes=(*verdict.notes, *coverage.notes),
        coverage=coverage.to_json(),
    )
