"""cluster.yaml in, a validated :class:`~fdl_tasks.model.Cluster` out.

The YAML is read strictly (a key given twice is an error, aliases cannot
expand without bound), then structured by :mod:`fdl_tasks.converter`;
cross-field rules (duplicate host labels, a Docker-mountable root) follow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import yaml

from fdl_tasks.auto_arch import AUTO
from fdl_tasks.backends.fit import misfits
from fdl_tasks.converter import structure
from fdl_tasks.cross_targets import GNU_TARGETS
from fdl_tasks.dist import check_dist
from fdl_tasks.errors import FdlError
from fdl_tasks.model import Cluster
from fdl_tasks.values import kind_of, quote

#: How many values a cluster file may hold once YAML aliases are expanded.
MAX_VALUES = 100_000


def parse_cluster(data: object, source: str) -> Cluster:
    """Structure already-parsed YAML data; ``source`` names the file in errors."""
    if isinstance(data, dict) and set(data) == {"cluster"}:
        data = data["cluster"]
    if not isinstance(data, dict):
        raise FdlError(
            f"{source}: expected a mapping with 'controller' and 'workers', got {kind_of(data)}"
        )
    cluster = structure(data, Cluster, f"{source} is not a valid cluster file")
    _check_cross(cluster, source)
    problems = misfits(cluster.controller)
    if problems:
        raise FdlError(f"{source} is not a valid cluster file: {problems[0]}.")
    cluster = attrs.evolve(  # each worker's delivery resolved: its own, else the cluster's
        cluster,
        source=source,
        workers=tuple(
            attrs.evolve(w, delivery=w.delivery or cluster.delivery) for w in cluster.workers
        ),
    )
    dist = cluster.controller.dist
    problem = check_dist(dist) if dist else None
    if problem:
        raise FdlError(f"{source} is not a valid cluster file: controller.dist: {problem}.")
    seen: dict[str, int] = {}
    for index, worker in enumerate(cluster.workers):
        if worker.host in seen:
            raise FdlError(
                f"{source} is not a valid cluster file: workers[{index}].host: "
                f"host label {worker.host!r} is already used by "
                f"workers[{seen[worker.host]}]."
            )
        seen[worker.host] = index
        if worker.arch == AUTO and worker.delivery == "copy":
            raise FdlError(
                f"{source} is not a valid cluster file: workers[{index}].arch: 'auto' is "
                f"chosen among the controller's variants, but {worker.host!r} is a copy host, "
                "which must already hold its variant: name it (e.g. arch: precompiled/cu128) "
                "and put it there with inv push-libtorch."
            )
    return cluster


def _check_cross(cluster: Cluster, source: str) -> None:
    """Each cross setup must be complete (whether it fits the build mode is the backend's)."""
    for machine, setup in cluster.controller.cross.items():
        where = f"{source} is not a valid cluster file: controller.cross[{machine!r}]"
        if machine not in GNU_TARGETS and not (setup.target and setup.linker):
            raise FdlError(
                f"{where}: no default Rust target and linker are known for {machine}: "
                "set 'target' (e.g. 'riscv64gc-unknown-linux-gnu') and 'linker'."
            )


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error, not last-wins."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            line = key_node.start_mark.line + 1
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {quote(key_node.value)} is given twice in one mapping "
                    f"(lines {seen[key_node.value]} and {line})",
                    key_node.start_mark,
                )
            seen[key_node.value] = line
        return super().construct_mapping(node, deep=deep)


def _check_size(data: object, source: str) -> None:
    """Refuse a file whose aliases expand past :data:`MAX_VALUES` (a "billion laughs").

    PyYAML shares aliased objects, so loading is cheap; walking them is not.
    Counting visits, shared ones included, bounds every later step.
    """
    budget, pending = MAX_VALUES, [data]
    while pending:
        value = pending.pop()
        budget -= 1
        if budget < 0:
            raise FdlError(
                f"{source} is not a valid cluster file: it expands to more than "
                f"{MAX_VALUES} values (YAML aliases nested too deep?)."
            )
        if isinstance(value, dict):
            pending += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            pending += value


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster file; every failure is one :class:`FdlError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FdlError(
            f"cluster file {source} not found (set fdl.cluster_file or pass --cluster-file)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FdlError(f"cannot read cluster file {source}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FdlError(f"{source} is not valid YAML{where}: {problem}.") from None
    _check_size(data, source)
    return parse_cluster(data, source)
