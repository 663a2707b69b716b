"""``fdl-tasks.yml``: this tool's own keys for a cluster that flodl's files describe. Pure.

flodl refuses any key it does not know, at every level of its files, so
this tool's keys (cross builds, distributed compiles, ``docker run`` images,
copy delivery, a worker's CPU architecture or features) cannot sit in
``fdl.cluster.yml``. They live in ``fdl-tasks.yml`` beside ``fdl.yml``,
which flodl never reads, and are added onto flodl's block here, workers
matched by their host label. Their values are checked with the rest of the
cluster by the converter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fdl_tasks.config.flodl_schema import CONTROLLER, WORKER
from fdl_tasks.config.values import kind_of, quote
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.suggest import close_matches, quoted_choice

#: This tool's keys, by where they go in the cluster.
CONTROLLER_KEYS = ("docker", "cross", "dist", "gpu_builds")
WORKER_KEYS = ("cpu_arch", "features", "delivery")
TOP_KEYS = ("controller", "workers", "delivery")


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FdlError(f"{where}: expected a mapping, got {kind_of(value)}")
    return value


def _only(
    data: Mapping[str, Any],
    allowed: tuple[str, ...],
    flodl: Mapping[str, Any],
    where: str,
    home: str,
) -> None:
    """Every key is one of ours; a flodl key gets the file where it belongs."""
    for key in data:
        if key in flodl:
            raise FdlError(f"{where}.{key} is flodl's key: set it in {home}")
        if key not in allowed:
            raise FdlError(
                f"{where}: unknown key {quote(key)}; expected one of: {', '.join(allowed)}"
            )


def with_extras(
    block: Mapping[str, Any], extras: object, source: str, flodl_file: str
) -> dict[str, Any]:
    """flodl's cluster ``block`` with the keys of ``fdl-tasks.yml`` (``extras``) added."""
    result = dict(block)
    if extras is None:
        return result
    top = _mapping(extras, source)
    _only(top, TOP_KEYS, {"env": 1, "gpu_ram_share": 1}, source, flodl_file)
    controller = _mapping(top.get("controller"), f"{source}: controller")
    flodl_keys = {key: rule for key, rule in CONTROLLER.items() if key != "docker"}
    _only(controller, CONTROLLER_KEYS, flodl_keys, f"{source}: controller", flodl_file)
    if "docker" in controller and not isinstance(controller["docker"], dict):
        raise FdlError(
            f"{source}: controller.docker here is a 'docker run' setup (a mapping with "
            f"image); the compose service is flodl's controller.docker, in {flodl_file}"
        )
    result["controller"] = {**block["controller"], **controller}
    workers = _mapping(top.get("workers"), f"{source}: workers")
    labels = [str(w.get("host")) for w in block["workers"]]
    for label, keys in workers.items():
        where = f"{source}: workers[{quote(label)}]"
        if label not in labels:
            close = close_matches(str(label), labels, cutoff=0.75)
            guess = f" did you mean {quoted_choice(close)}?" if close else ""
            raise FdlError(f"{where}: no worker of {flodl_file} has this host label;{guess}")
        _only(_mapping(keys, where), WORKER_KEYS, WORKER, where, flodl_file)
    result["workers"] = [{**w, **(workers.get(w.get("host")) or {})} for w in block["workers"]]
    if "delivery" in top:
        result["delivery"] = top["delivery"]
    return result
