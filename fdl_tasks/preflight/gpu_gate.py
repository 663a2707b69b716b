"""The GPU gate of preflight: each host's GPUs against its variant's ``.arch``.

The thin I/O layer over :mod:`fdl_tasks.gpu.coverage`: it reads each variant's
``.arch`` on the controller (``<controller.path>/libtorch/<arch>/.arch``) and
folds the coverage verdict into the host's preflight verdict, before any build.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from fdl_tasks.config.installed_variants import installed_variants, read_arch_file
from fdl_tasks.config.model import Cluster, Worker
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.auto_arch import AUTO, choose
from fdl_tasks.gpu.coverage import judge_coverage
from fdl_tasks.gpu.gpus import unknown_name_warning, vendor_of
from fdl_tasks.gpu.launch_facts import all_devices_error
from fdl_tasks.preflight.probe import HostVerdict, Status


def _choose_arch(verdict: HostVerdict, worker: Worker, root: Path) -> HostVerdict | Worker:
    """``arch: auto``: the worker with its chosen arch, or the host's refusal."""
    facts = verdict.facts
    assert facts is not None and facts.gpus is not None
    choice = choose(installed_variants(root), facts.gpus, facts.cpu_arch or worker.cpu_arch)
    if choice.arch is None:
        gpus = ", ".join(
            f"{g.name} ({g.target or 'no architecture reported'})" for g in facts.gpus.gpus
        )
        gpus = gpus or "no GPU"
        error = (
            f"arch: auto: no installed variant fits this host ({gpus}); considered: "
            f"{choice.summary()}"
        )
        return attrs.evolve(verdict, status="error", errors=(*verdict.errors, error))
    return attrs.evolve(worker, arch=choice.arch)


def _cpu_by_default(chosen: str, tools: Sequence[str]) -> str:
    """auto fell back to a CPU variant because no GPU was listed: say why it may be wrong."""
    why = (
        f"{', '.join(tools)} listed no GPU"
        if tools
        else "no GPU tool (nvidia-smi, rocminfo, KFD's topology) answered over ssh"
    )
    return (
        f"arch: auto chose the CPU-only {chosen}: {why}; if this host has GPUs, put the tool "
        "on the non-interactive ssh PATH or set its arch"
    )


def gate(verdict: HostVerdict, worker: Worker, root: Path) -> HostVerdict:
    """The verdict with the host's GPU errors (``local_devices: all`` counting none among
    them), warnings and notes added.

    A host that gave no answer, was not asked about GPUs, or has no arch is left as it is.
    """
    facts = verdict.facts
    if worker.arch is None or facts is None or facts.data is None or facts.gpus is None:
        return verdict
    chosen = None
    if worker.arch == AUTO:
        picked = _choose_arch(verdict, worker, root)
        if isinstance(picked, HostVerdict):
            return picked
        worker, chosen = picked, picked.arch
        verdict = attrs.evolve(verdict, notes=(*verdict.notes, f"arch: auto chose {chosen}"))
    assert worker.arch is not None
    warnings = list(verdict.warnings)
    if chosen and not facts.gpus.gpus and vendor_of(chosen, worker.features) == "cpu":
        warnings.append(_cpu_by_default(chosen, facts.gpus.tools))
    if worker.features is None and (naming := unknown_name_warning(worker.arch)):
        warnings.append(naming)
    vendor = vendor_of(worker.arch, worker.features)
    info = read_arch_file(root, worker.arch) if vendor != "cpu" else None
    coverage = judge_coverage(worker.arch, vendor, facts.gpus, info)
    devices = all_devices_error(worker.local_devices, vendor, facts.gpus)
    errors = (*verdict.errors, *coverage.errors, *([devices] if devices else []))
    warnings += coverage.warnings
    status: Status = "error" if errors else "warning" if warnings else verdict.status
    return attrs.evolve(
        verdict,
        status=status,
        errors=errors,
        warnings=tuple(warnings),
        notes=(*verdict.notes, *coverage.notes),
        coverage=coverage.to_json(),
        arch=chosen,
    )


def with_chosen_archs(cluster: Cluster, verdicts: Sequence[HostVerdict]) -> Cluster:
    """The cluster with each ``arch: auto`` worker's chosen arch, exactly as if written
    by hand; a remote auto host that preflight could not probe is an error."""
    chosen = {v.host: v.arch for v in verdicts if v.arch}
    remote = {v.host for v in verdicts if not v.local}
    unresolved = [
        w.host
        for w in cluster.workers
        if w.arch == AUTO and w.host in remote and w.host not in chosen
    ]
    if unresolved:
        raise FdlError(
            f"arch: auto on {', '.join(unresolved)}, but preflight could not probe "
            "them (unreachable?): nothing was built; set their 'arch' by hand"
        )
    workers = tuple(
        attrs.evolve(w, arch=chosen[w.host]) if w.arch == AUTO else w for w in cluster.workers
    )
    return attrs.evolve(cluster, workers=workers)
