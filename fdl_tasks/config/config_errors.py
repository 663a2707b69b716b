"""Mistakes in Invoke's own configuration files, said as one paragraph naming the file
and line, as :mod:`fdl_tasks.config.loader` says them for the cluster file.

Invoke reads ``invoke.yaml`` itself, after importing ``tasks.py``; a file that is
not YAML, or whose section cannot merge with the collection's (``fdl:`` left with
every line under it commented out is ``fdl: null``), is an exception of Invoke's,
not ours. :mod:`fdl_tasks.cli` catches it on its way out; this module only words it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import yaml

from fdl_tasks.config.values import kind_of

#: Top-level keys of a cluster file: Invoke's configuration never holds them.
CLUSTER_KEYS = ("cluster", "controller", "workers")


def yaml_problem(exc: Exception, fallback: str) -> str:
    """``exc`` (PyYAML's, or the copy Invoke vendors, from reading a file) as one
    paragraph naming file and line."""
    mark = getattr(exc, "problem_mark", None)
    name = str(getattr(mark, "name", "") or "")
    source = name if name and not name.startswith("<") else fallback  # "<unicode string>"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context, at = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and at is not None and (mark is None or at.line != mark.line):
        context += f" at line {at.line + 1}, column {at.column + 1}"
    detail = f"{problem} ({context})" if context else problem
    return f"{source} is not valid YAML{where}: {detail}."


def key_line(text: str, keys: Sequence[str]) -> int | None:
    """The line (1-based) of the key ``keys`` leads to in the YAML ``text``, if found."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return line
        found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key]
        if not found:
            return line
        key_node, node = found[-1]
        line = key_node.start_mark.line + 1
    return line


def value_at(data: object, keys: Sequence[str]) -> tuple[bool, object]:
    """Whether ``data`` has the nested key ``keys``, and its value there."""
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return False, None
        data = data[key]
    return True, data


def merge_problem(path: str, text: str, keys: Sequence[str], value: object) -> str:
    """A value of file ``path`` that cannot merge with the mapping (or single value) the
    collection's configuration has at ``keys``: one paragraph with its line."""
    line = key_line(text, keys)
    where = f"{path}, line {line}" if line else path
    name = ".".join(keys)
    if isinstance(value, Mapping):
        return (
            f"{where}: '{name}' is a mapping here, but a single value in the configuration "
            f"it merges into: give it a single value."
        )
    what = "empty (every line under it commented out?)" if value is None else kind_of(value)
    example = " (e.g. 'fdl: {cluster_file: fdl.cluster.yml}')" if name == "fdl" else ""
    return (
        f"{where}: '{name}' is {what}, but it must be a mapping of settings: put its "
        f"settings under it{example}, or remove the line."
    )


def not_a_mapping(path: str, data: object) -> str:
    """A configuration file that is one value or a list, not settings by name."""
    return (
        f"{path}: the file is {kind_of(data)}, but it must be a mapping of settings "
        "(e.g. 'fdl: {cluster_file: fdl.cluster.yml}')"
    )


def misplaced_cluster_file(
    present: Collection[str], runtime_path: str | None, task: str
) -> str | None:
    """``inv -f cluster.yaml prebuild``: before the task name, ``-f`` is Invoke's own
    ``--config``, so the cluster file was read as Invoke's configuration; ``present``: which
    of :data:`CLUSTER_KEYS` Invoke's configuration holds."""
    if not present:
        return None
    what = runtime_path or "a configuration file"
    return (
        f"{what} was read as Invoke's configuration (-f before the task name is Invoke's "
        f"--config), not as the cluster file: put -f after the task name, e.g. "
        f"inv {task} -f {what}"
    )
