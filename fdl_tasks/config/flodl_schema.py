"""flodl's own rules for its config files, checked as fdl-cli checks them. Pure.

fdl-cli reads ``fdl.yml`` (merged with its ``fdl.<env>.yml`` overlay) into
serde structs that are all ``deny_unknown_fields``, then validates the
cluster block (``ClusterConfig::validate`` and the load-time checks). A file
it refuses fails ``fdl @cluster`` at launch, after every build: these rules
refuse it before any. Each table below mirrors one of flodl's structs; a
problem is one line with its key path. Keys of this tool's own that sit
inside flodl's blocks get a line of their own, saying where they belong
(:data:`EXTRAS_FILE`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fdl_tasks.config.values import LAUNCHER_OWNED, LAUNCHER_OWNED_PREFIX, kind_of, quote

#: Where this tool's own keys live on a flodl project: flodl never reads it.
EXTRAS_FILE = "fdl-tasks.yml"
#: ``controller.join.start``'s values.
JOIN_STARTS = ("auto", "manual", "hybrid")

ValueCheck = Callable[[object], str | None]
#: A struct: each key's check (or nested struct, null allowed unless required), and whether
#: serde requires the key.
Struct = Mapping[str, tuple["ValueCheck | Struct", bool]]


def _string(value: object) -> str | None:
    """serde_yaml reads any plain scalar into a ``String``; null and collections are refused."""
    if value is None or isinstance(value, dict | list):
        return f"expected a string, got {kind_of(value)}"
    return None


def _whole(limit: int) -> ValueCheck:
    def check(value: object) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"expected an integer, got {kind_of(value)}"
        if not 0 <= value <= limit:
            return f"{quote(value)} does not fit (0 to {limit})"
        return None

    return check


_U8, _U16, _U64 = _whole(255), _whole(65535), _whole(2**64 - 1)


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {quote(value)}"


def _number(value: object) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"expected a number, got {kind_of(value)}"
    if not math.isfinite(value) or value < 0:
        return f"must be a non-negative fraction of host RAM (e.g. 0.5), got {quote(value)}"
    return None


def _strings(value: object) -> str | None:
    if not isinstance(value, list):
        return f"expected a list, got {kind_of(value)}"
    return next((f"[{i}]: {p}" for i, v in enumerate(value) if (p := _string(v))), None)


def _env(value: object) -> str | None:
    if not isinstance(value, dict):
        return f"expected a mapping, got {kind_of(value)}"
    for name, text in value.items():
        if name in LAUNCHER_OWNED or str(name).startswith(LAUNCHER_OWNED_PREFIX):
            return f"[{quote(name)}] is reserved (the launcher sets it for each rank)"
        if problem := _string(text):
            return f"[{quote(name)}]: {problem}"
    return None


def _local_devices(value: object) -> str | None:
    """``"all"``, or a list of device numbers that each fit a u8 (flodl parses it by hand)."""
    if value == "all":
        return None
    if isinstance(value, list):
        return next((f"[{i}]: {p}" for i, v in enumerate(value) if (p := _U8(v))), None)
    return f'expected "all" or a list of device numbers (0 to 255), got {quote(value)}'


def _start(value: object) -> str | None:
    if value not in JOIN_STARTS:
        return f"must be one of {' | '.join(JOIN_STARTS)}, got {quote(value)}"
    return None


def _anything(value: object) -> str | None:
    return None


def _optional(check: ValueCheck) -> ValueCheck:
    """serde's ``Option``: null is None."""
    return lambda value: None if value is None else check(value)


#: fdl-cli's structs, each field in its declaration order (serde names them so):
#: ``key`` is required, ``key=`` has a default, ``key?`` is an ``Option`` (null allowed);
#: ``:kind`` names its check or nested struct (none: a ``String``).
DECLARED: Mapping[str, str] = {
    "ssh": "target? port?:u16 user? identity_file? options=:strings",
    "join": "min_rank_start?:u64 join_timeout?:u64 target_ranks?:u64 max_join_timeout?:u64 "
    "open_admission?:bool discovery?:bool token? tunnel_only?:bool start?:start",
    "controller": "host port=:u16 path docker? arch? data_path? join=:join",
    # ranks: refused when not empty (:func:`cluster_problems`)
    "worker": "host ranks=:any local_devices:devices nccl_socket_ifname path ssh=:ssh "
    "tunnel=:bool arch? data_path? gpu_ram_share?:number docker? env=:env",
    # workers: each entry is a worker, checked on its own
    "cluster": "controller:controller workers:any env=:env gpu_ram_share?:number",
}
_KINDS: Mapping[str, ValueCheck] = {
    "string": _string,
    "u16": _U16,
    "u64": _U64,
    "bool": _boolean,
    "strings": _strings,
    "start": _start,
    "any": _anything,
    "devices": _local_devices,
    "number": _number,
    "env": _env,
}


def _structs() -> dict[str, Struct]:
    """:data:`DECLARED` read, each struct after those it nests."""
    structs: dict[str, Struct] = {}
    for name, fields in DECLARED.items():
        struct: dict[str, tuple[ValueCheck | Struct, bool]] = {}
        for field in fields.split():
            key, _, kind = field.partition(":")
            rule: ValueCheck | Struct = structs.get(kind) or _KINDS[kind or "string"]
            bare = key.rstrip("?=")
            if key.endswith("?"):
                assert callable(rule), "an Option of a struct is not declared"
                rule = _optional(rule)
            struct[bare] = (rule, key == bare)
        structs[name] = struct
    return structs


STRUCTS = _structs()
CONTROLLER, WORKER, CLUSTER = STRUCTS["controller"], STRUCTS["worker"], STRUCTS["cluster"]
#: ``fdl.yml``'s top level; only ``cluster`` is this tool's business, the rest is named only.
PROJECT_KEYS = ("description", "commands", "cluster", "join", "publish")

#: This tool's keys, by the flodl block they would sit in: flodl refuses each there.
OURS: Mapping[str, tuple[str, ...]] = {
    "cluster": ("delivery",),
    "cluster.controller": ("cross", "dist", "gpu_builds"),
    "cluster.workers[]": ("cpu_arch", "features", "delivery"),
}


def struct_problems(value: object, fields: Struct, where: str = "") -> list[str]:
    """serde's view of one struct: a mapping, no unknown key, required keys, each value."""
    if not isinstance(value, dict):
        return [f"{where or '(top level)'}: expected a mapping, got {kind_of(value)}"]
    prefix = f"{where}." if where else ""
    expected = ", ".join(fields)
    problems = [
        f"{prefix}{key}: unknown field (expected one of: {expected})"
        for key in value
        if key not in fields
    ]
    for name, (rule, required) in fields.items():
        path = prefix + name
        if name not in value:
            if required:
                problems.append(f"{path}: missing field")
        elif isinstance(rule, Mapping):
            if value[name] is not None or required:
                problems += struct_problems(value[name], rule, path)
        elif problem := rule(value[name]):
            problems.append(path + ("" if problem.startswith("[") else ": ") + problem)
    return problems


def our_keys(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each key of this tool's inside flodl's cluster block: its path, and the line saying
    where it belongs."""
    block = data.get("cluster")
    if not isinstance(block, dict):
        return []
    found: list[tuple[str, str]] = [("cluster", k) for k in OURS["cluster"] if k in block]
    controller = block.get("controller")
    if isinstance(controller, dict):
        found += [("cluster.controller", k) for k in OURS["cluster.controller"] if k in controller]
        if isinstance(controller.get("docker"), dict):
            found.append(("cluster.controller", "docker"))
    workers = block.get("workers")
    for index, worker in enumerate(workers if isinstance(workers, list) else []):
        if isinstance(worker, dict):
            where = f"cluster.workers[{index}]"
            found += [(where, k) for k in OURS["cluster.workers[]"] if k in worker]
    return [
        (f"{where}.{key}", f"{where}.{key} is fdl-tasks' key, not flodl's: {_belongs(where, key)}")
        for where, key in found
    ]


def _belongs(where: str, key: str) -> str:
    if where == "cluster":
        return f"move it to {EXTRAS_FILE} ({key}: ...)"
    if where == "cluster.controller":
        what = "a docker run image (a mapping)" if key == "docker" else key
        return f"move {what} to {EXTRAS_FILE} under controller"
    return f"move it to {EXTRAS_FILE} under workers: {{<host label>: {{{key}: ...}}}}"


def project_problems(data: object) -> list[str]:
    """Every reason fdl-cli refuses this merged ``fdl.yml``, its cluster block checked in full.

    Our own keys come first: their line says where they belong, not merely "unknown".
    """
    if data is None:
        return []
    if not isinstance(data, dict):
        return [f"(top level): expected a mapping, got {kind_of(data)}"]
    ours = our_keys(data)
    explained = tuple(f"{path}:" for path, _ in ours)  # their "unknown field" lines
    unknown = [k for k in data if k not in PROJECT_KEYS]
    problems = [f"{k}: unknown field (expected one of: {', '.join(PROJECT_KEYS)})" for k in unknown]
    if data.get("description") is not None and (p := _string(data["description"])):
        problems.append(f"description: {p}")
    if data.get("commands") is not None and not isinstance(data["commands"], dict):
        problems.append(f"commands: expected a mapping, got {kind_of(data['commands'])}")
    if (block := data.get("cluster")) is not None:
        problems += [p for p in cluster_problems(block) if not p.startswith(explained)]
    return [line for _, line in ours] + problems


def cluster_problems(block: object) -> list[str]:
    """The cluster block as serde reads it, then ``ClusterConfig::validate`` and the
    load-time checks (user-written ``ranks``, ``gpu_ram_share``)."""
    problems = struct_problems(block, CLUSTER, "cluster")
    if not isinstance(block, dict):
        return problems
    workers = block.get("workers")
    if "workers" in block and not isinstance(workers, list):
        problems.append(f"cluster.workers: expected a list, got {kind_of(workers)}")
        workers = []
    for index, worker in enumerate(workers or []):
        problems += struct_problems(worker, WORKER, f"cluster.workers[{index}]")
    return problems or _validate(block)


def _blank(value: object) -> bool:
    return value is None or not str(value).strip()


def _validate(block: Mapping[str, Any]) -> list[str]:
    """``ClusterConfig::validate`` and fdl-cli's load-time rules, on a block serde accepts."""
    problems = []
    controller, workers = block["controller"], block["workers"]
    join = controller.get("join") or {}
    for key in ("host", "path"):
        if _blank(controller[key]):
            problems.append(f"cluster.controller.{key} must be non-empty")
    if not workers and join.get("discovery") is not True:
        problems.append(
            "cluster.workers must be non-empty (a roster-free window needs "
            "controller.join.discovery: true)"
        )
    for index, worker in enumerate(workers):
        where = f"cluster.workers[{index}]"
        if worker.get("ranks"):
            problems.append(
                f"{where}.ranks: ranks are not user configuration (flodl computes them from "
                "the probed device counts): remove the key"
            )
        if _blank(worker["host"]):
            problems.append(f"{where}.host must be non-empty")
        if len(workers) > 1 and _blank(worker["nccl_socket_ifname"]):
            problems.append(
                f"{where}.nccl_socket_ifname must be non-empty when the cluster spans "
                "multiple workers"
            )
        if _blank(worker["path"]):
            problems.append(f"{where}.path (the project checkout dir) must be non-empty")
    return problems
