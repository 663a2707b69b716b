"""A cluster file in, a validated :class:`~fdl_tasks.config.model.Cluster` out.

Two forms. This tool's own ``cluster.yaml`` (controller and workers at the
top). And flodl's files: ``fdl.yml`` with its ``fdl.<env>.yml`` overlay, or
any file whose top level holds ``cluster:``, read through flodl's layering
(:mod:`fdl_tasks.config.flodl_layers`) and refused as fdl-cli refuses it
(:mod:`fdl_tasks.config.flodl_schema`), with this tool's own keys added from
``fdl-tasks.yml`` beside it, where flodl never looks.

The YAML is read strictly (a key given twice is an error, aliases cannot
expand without bound), then structured by :mod:`fdl_tasks.config.converter`;
cross-field rules (duplicate host labels, a Docker-mountable root) follow.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import attrs
import yaml

from fdl_tasks.cargo.cross_targets import GNU_TARGETS
from fdl_tasks.config import flodl_layers, flodl_schema
from fdl_tasks.config.converter import structure
from fdl_tasks.config.dist_settings import check_dist
from fdl_tasks.config.extras import with_extras
from fdl_tasks.config.mode_fit import misfits
from fdl_tasks.config.model import Cluster, FlodlOrigin
from fdl_tasks.config.values import kind_of, quote
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.auto_arch import AUTO

#: How many values a cluster file may hold once YAML aliases are expanded.
MAX_VALUES = 100_000


def parse_cluster(data: object, source: str) -> Cluster:
    """Structure already-parsed data of this tool's form; ``source`` names the file."""
    if not isinstance(data, dict):
        raise FdlError(
            f"{source}: expected a mapping with 'controller' and 'workers', got {kind_of(data)}"
        )
    cluster = structure(data, Cluster, f"{source} is not a valid cluster file")
    _check_cross(cluster, source)
    if problems := misfits(cluster.controller):
        raise FdlError(f"{source} is not a valid cluster file: {problems[0]}.")
    cluster = attrs.evolve(  # each worker's delivery resolved: its own, else the cluster's
        cluster,
        source=source,
        workers=tuple(
            attrs.evolve(w, delivery=w.delivery or cluster.delivery) for w in cluster.workers
        ),
    )
    if cluster.controller.dist and (problem := check_dist(cluster.controller.dist)):
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


class _Yaml12Loader(_StrictLoader):
    """flodl's files as serde_yaml reads them: YAML 1.2 booleans (``yes``, ``on`` are text)."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


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


def read_data(path: Path) -> Any:
    """One file's data: YAML (JSON for ``.json``), every failure one :class:`FdlError`."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FdlError(
            f"cluster file {source} not found (set fdl.cluster_file or pass --cluster-file)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FdlError(f"cannot read cluster file {source}: {exc}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FdlError(f"{source} is not valid JSON: {exc}.") from None
    else:
        loader = _Yaml12Loader if flodl_layers.is_layer(path) else _StrictLoader
        try:
            data = yaml.load(text, Loader=loader)  # a SafeLoader subclass
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise FdlError(f"{source} is not valid YAML{where}: {problem}.") from None
    _check_size(data, source)
    return data


#: This tool's own cluster file, looked for first in the project root.
OWN_FILE = "cluster.yaml"


def find_cluster_file(project: Path) -> Path:
    """With no cluster file named: ``cluster.yaml`` in the project root, else the base
    ``fdl.yml`` of the flodl project there or above it (as fdl-cli finds it)."""
    own = project / OWN_FILE
    if own.is_file():
        return own
    for directory in (project, *project.parents):
        base = flodl_layers.first_existing(directory, flodl_layers.BASE_NAMES, Path.is_file)
        if base is not None:
            return base
    raise FdlError(
        f"no cluster file: no {OWN_FILE} in {project}, and no flodl project (fdl.yml) there "
        "or above it: write one (docs/cluster-file.md), or name it with fdl.cluster_file "
        "or --cluster-file"
    )


def load_cluster(path: str | Path, env: str | None = None) -> Cluster:
    """Read and validate a cluster file of either form; every failure is one :class:`FdlError`.

    ``env``: the flodl env chosen (``--env``, ``$FDL_ENV``, ``fdl.env``), for a flodl base.
    """
    path = Path(path)
    data = read_data(path)
    if flodl_layers.is_layer(path) or (isinstance(data, dict) and "cluster" in data):
        return load_flodl(path, env)
    return parse_cluster(data, str(path))


def load_flodl(path: Path, env: str | None) -> Cluster:
    """The cluster block ``fdl @<env>`` would see, refused where fdl-cli refuses it, with
    ``fdl-tasks.yml``'s keys added."""
    path = Path(os.path.abspath(path))
    base, overlay, chosen = _layer_files(path, flodl_layers.check_env(env) if env else None)
    layers = flodl_layers.project_layers(base, overlay, read_data, os.path.expanduser("~"))
    data = flodl_layers.merged(layers)
    primary = overlay or path
    if problems := flodl_schema.project_problems(data):
        culprit = flodl_layers.holding(layers, _key_path(problems[0]))
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise FdlError(f"{culprit}: flodl's loader refuses it: {problems[0]}{more}.")
    block = data.get("cluster") if isinstance(data, dict) else None
    if block is None:
        names = " + ".join(str(p) for p, _ in layers)
        raise FdlError(
            f"{names} holds no cluster block: flodl's cluster is a 'cluster:' mapping with "
            f"controller and workers, in fdl.yml or an overlay such as fdl.cluster.yml"
        )
    extras_file = (base or path).parent / flodl_schema.EXTRAS_FILE
    extras = read_data(extras_file) if extras_file.is_file() else None
    cluster = parse_cluster(
        with_extras(block, extras, str(extras_file), str(primary)), str(primary)
    )
    origin = FlodlOrigin(
        root=str(base.parent) if base else None,
        env=chosen,
        layers=tuple(str(p) for p, _ in layers),
        extras=str(extras_file) if extras is not None else None,
    )
    return attrs.evolve(cluster, origin=origin)


def _layer_files(path: Path, env: str | None) -> tuple[Path | None, Path | None, str | None]:
    """The base, the overlay and its env for a flodl file named as the cluster file."""
    directory = path.parent
    if (named := flodl_layers.overlay_env(path)) is not None:
        if env and env != named:
            raise FdlError(
                f"conflicting envs: {path} is the overlay of env {named!r}, but env {env!r} "
                "was chosen (--env, $FDL_ENV or fdl.env)"
            )
        base = flodl_layers.first_existing(directory, flodl_layers.BASE_NAMES, Path.is_file)
        return base, path, named
    if not flodl_layers.is_base(path):  # a file whose top level holds ``cluster:``
        return None, path, None
    wanted = env or flodl_layers.DEFAULT_ENV
    names = flodl_layers.overlay_names(wanted)
    overlay = flodl_layers.first_existing(directory, names, Path.is_file)
    if overlay is None and env:
        raise FdlError(f"environment {env!r} not found (expected {names[1]} next to {path})")
    return path, overlay, wanted if overlay else None


_PATH_TOKEN = re.compile(r"([A-Za-z_][\w-]*)|\[(\d+)\]")


def _key_path(problem: str) -> tuple[str | int, ...]:
    """``cluster.workers[1].port: ...`` → ``("cluster", "workers", 1, "port")``."""
    head = re.split(r"[: ]", problem, maxsplit=1)[0]
    return tuple(name or int(index) for name, index in _PATH_TOKEN.findall(head))
