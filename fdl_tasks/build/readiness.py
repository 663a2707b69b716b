"""What the controller must have before any build, said as the fix: pure logic.

Preflight reports each of these as an error of the controller's verdict; the
runs without a preflight (a watch cycle, ``build-host``) refuse with the same
words (:mod:`fdl_tasks.build.readiness_io` asks the questions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fdl_tasks.core.suggest import quoted_choice

#: What a run that refuses before building adds to its reasons.
NOTHING_BUILT = "nothing was built"


def root_missing(root: str, source: str) -> str:
    """``controller.path`` is not a directory here: every other controller check follows."""
    return (
        f"controller.path {root} in {source} does not exist on this machine: set it to the "
        "project root as this machine sees it (the directory holding Cargo.toml and libtorch/)"
    )


def crate_missing(directory: str, option: str | None, source: str) -> str:
    """No ``Cargo.toml`` where the crate dir points: name the key that chose it."""
    if option:
        return (
            f"no Cargo.toml in {directory}: --crate-dir / fdl.crate_dir {option!r} is relative "
            f"to controller.path in {source}"
        )
    return (
        f"no Cargo.toml in {directory}: is controller.path in {source} the project root? "
        "(else pass --crate-dir, relative to it)"
    )


def variants_missing(absent: Iterable[tuple[str, str, str]]) -> str | None:
    """(host, arch, lib dir) of each variant the controller lacks; ``None``: none lacked."""
    lines = sorted({f"{host} (arch {arch}): {lib}" for host, arch, lib in absent})
    if not lines:
        return None
    return "libtorch variant(s) not found on the controller (a typo in 'arch'?): " + "; ".join(
        lines
    )


def controller_arch_missing(arch: str, lib: str, source: str, close: Sequence[str]) -> str:
    """``controller.arch`` names a variant this machine lacks: fdl-tasks builds each host
    against its own arch, but flodl's launcher builds against this one before a run."""
    hint = f" (did you mean {quoted_choice(list(close))}?)" if close else ""
    return (
        f"controller.arch {arch!r} in {source} names no libtorch variant on this machine: "
        f"{lib} is missing{hint}. fdl-tasks' builds do not use it (each host's own 'arch' "
        "decides), but flodl's launcher builds against it before a run (fdl @<env>)"
    )


def has_std(names: Iterable[str]) -> bool:
    """Whether a ``rustc --print target-libdir`` directory's file names include the
    standard library (``libstd-<hash>.rlib``)."""
    return any(name.startswith("libstd-") and name.endswith(".rlib") for name in names)


def cross_std_missing(missing: Mapping[str, str], cpus: Mapping[str, str]) -> str:
    """Native cross targets whose ``std`` rustc lacks: target → what rustc answered,
    target → the CPU architecture built for."""
    parts = [f"{t} (for {cpus.get(t, '?')} hosts): {why}" for t, why in sorted(missing.items())]
    return (
        "native cross build(s) without the Rust standard library of their target: "
        + "; ".join(parts)
        + f". Install it (rustup target add {' '.join(sorted(missing))}), or build in Docker "
        "(controller.docker)"
    )
