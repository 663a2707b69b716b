"""The controller's side of readiness: everything a prebuild refuses before building, asked
once, by preflight and by the runs that make none (a watch cycle, ``build-host``).

Thin I/O over :mod:`fdl_tasks.build.readiness` (the words) and the backend's own
check (the build tool, its daemon and images, a native cross target's ``std``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fdl_tasks.build.backends.protocol import Backend
from fdl_tasks.build.build_environment import BuildEnvironment, BuildJob
from fdl_tasks.build.build_plan import plan_environments
from fdl_tasks.build.readiness import (
    NOTHING_BUILT,
    controller_arch_missing,
    root_missing,
    variants_missing,
)
from fdl_tasks.config.installed_variants import installed_variants
from fdl_tasks.config.model import Worker
from fdl_tasks.config.variants import variant_lib
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.suggest import close_matches
from fdl_tasks.gpu.auto_arch import AUTO


def missing_variants(root: Path, environments: Mapping[str, BuildEnvironment]) -> dict[str, str]:
    """Each arch among these whose ``<controller.path>/libtorch/<arch>/lib`` is not there."""
    libs = {e.arch: variant_lib(str(root), e.arch) for e in environments.values()}
    return {arch: lib for arch, lib in libs.items() if not Path(lib).is_dir()}


def variant_problem(root: Path, environments: Mapping[str, BuildEnvironment]) -> str | None:
    """Each host's variant present, else which not."""
    return _said(environments, missing_variants(root, environments))


def _said(environments: Mapping[str, BuildEnvironment], missing: Mapping[str, str]) -> str | None:
    return variants_missing(
        (h, e.arch, missing[e.arch]) for h, e in environments.items() if e.arch in missing
    )


def environment_problems(
    root: Path, backend: Backend, environments: Mapping[str, BuildEnvironment]
) -> list[str]:
    """The variants, then the backend's tools and images for the build environments whose
    variant is there: a missing one's image is named after the same arch (its CUDA tag),
    so asking for it would only say that arch's typo again."""
    missing = missing_variants(root, environments)
    problems = [p for p in [_said(environments, missing)] if p]
    try:
        backend.check([e for e in environments.values() if e.arch not in missing])
    except FdlError as exc:
        problems.append(str(exc))
    return problems


def controller_problems(
    root: Path,
    source: str,
    backend: Backend,
    workers: Iterable[Worker],
    cpu_archs: Mapping[str, str],
) -> list[str]:
    """Preflight's controller checks, each problem a line: ``controller.path``, then each
    build environment of the workers with an arch (``auto`` ones are chosen later)."""
    if not root.is_dir():
        return [root_missing(str(root), source)]
    chosen = [w for w in workers if w.arch is not None and w.arch != AUTO]
    if not chosen:
        return []
    try:
        environments = plan_environments(chosen, backend, cpu_archs)
    except FdlError as exc:
        return [str(exc)]
    return environment_problems(root, backend, environments)


def controller_arch_problem(root: Path, arch: str | None, source: str) -> str | None:
    """``controller.arch``, which only flodl's launcher reads, naming a variant missing
    under ``controller.path`` (a warning of preflight's: no build of ours needs it)."""
    if arch is None or arch == AUTO or not root.is_dir():
        return None
    lib = variant_lib(str(root), arch)
    if Path(lib).is_dir():
        return None
    close = close_matches(arch, [variant.arch for variant in installed_variants(root)])
    return controller_arch_missing(arch, lib, source, close)


def require_ready(root: Path, backend: Backend, jobs: Sequence[BuildJob]) -> None:
    """The same checks for a run that makes no preflight: refuse with every problem."""
    environments = {host: job.build.environment for job in jobs for host in job.hosts}
    if problems := environment_problems(root, backend, environments):
        raise FdlError("\n".join(problems) + f"\n{NOTHING_BUILT}")
