"""cluster.yaml in, a validated :class:`~fdl_tasks.model.Cluster` out.

One cattrs converter does all structuring. It is strict where YAML is lax
(a port must be an integer, a list must be a list, a string a string) and
every problem is reported with its key path, e.g. ``workers[2].ssh.port``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_origin

import attrs
import cattrs
import yaml
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn

from fdl_tasks.errors import FdlError
from fdl_tasks.model import (
    AbsPath,
    Arch,
    Cluster,
    ComposeService,
    CudaRelease,
    DockerSettings,
    EnvName,
    EnvValue,
    HostLabel,
    ImageTemplate,
    LaunchEnvName,
    MountPath,
    Port,
    RamShare,
    ServiceName,
    SshOption,
)
from fdl_tasks.rules import CUDA_TAG_FIELD, CUDA_VERSION_FIELD, Cuda, split_ssh_option

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ARCH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: Variables flodl's launcher sets per rank; fdl-cli refuses them in a cluster's ``env``.
LAUNCHER_OWNED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "FLODL_HOST_NAME",
        "FDL_ENV",
    }
)
LAUNCHER_OWNED_PREFIX = "FLODL_INTERNAL_"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: How many values a cluster file may hold once YAML aliases are expanded.
MAX_VALUES = 100_000
#: How many problems one message lists, and how much of a bad value it quotes.
MAX_PROBLEMS, QUOTE_LIMIT = 8, 60


class InvalidValue(ValueError):
    """A value of the right shape but not acceptable; its text is shown as is."""


def cut(text: str) -> str:
    """``text`` cut to :data:`QUOTE_LIMIT` characters, so a message stays one short line."""
    return text if len(text) <= QUOTE_LIMIT else f"{text[: QUOTE_LIMIT - 5]}…{text[-4:]}"


def quote(value: object) -> str:
    """``repr(value)``, cut: how every message shows a bad value."""
    return cut(repr(value))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {_kind(value)}")
    if _CONTROL.search(value):
        raise InvalidValue(f"{quote(value)} contains a control character")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing (null)"
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return f"{names.get(type(value), type(value).__name__)} ({quote(value)})"


def check_label(value: object) -> HostLabel:
    """A host label is a path segment: letters, digits, ``.``, ``_``, ``-``."""
    text = _text(value)
    if not _LABEL.fullmatch(text):
        raise InvalidValue(
            f"host label {quote(text)} must start with a letter or digit and hold only "
            "letters, digits, '.', '_' and '-' (it becomes a directory name)"
        )
    return text


def check_arch(value: object) -> Arch:
    """An arch is a relative path under ``libtorch/`` that cannot escape it."""
    text = _text(value)
    segments = text.split("/")
    if text.startswith("/") or not all(_ARCH_SEGMENT.fullmatch(s) for s in segments):
        raise InvalidValue(
            f"arch {quote(text)} must be a relative path under libtorch/ such as "
            "'precompiled/cu128' or 'builds/sm61-sm120' (no '..', no empty or "
            "absolute segments)"
        )
    return text


def check_abs_path(value: object) -> AbsPath:
    """Paths are absolute: each host's view of a mount, never relative to a cwd."""
    text = _text(value)
    if not text:
        raise InvalidValue("expected a non-empty absolute path")
    if not text.startswith("/"):
        raise InvalidValue(f"expected an absolute path, got {quote(text)}")
    return text


def check_image(value: object) -> str:
    """An image name, whose only template fields are ``{cuda_version}`` and ``{cuda_tag}``."""
    text = _text(value)
    bare = text.replace(CUDA_VERSION_FIELD, "").replace(CUDA_TAG_FIELD, "")
    if not text or text.startswith("-") or any(c in bare for c in "{} \t"):
        raise InvalidValue(
            f"image {quote(text)} must be an image name such as 'flodl-cuda:{{cuda_tag}}': no "
            "spaces, no leading '-', and no template fields but {cuda_version} and {cuda_tag}"
        )
    return text


def check_cuda_release(value: object) -> CudaRelease:
    text = _text(value)
    if Cuda.parse(text) is None:
        raise InvalidValue(f"CUDA version {quote(text)} must look like '12.8' or '12.6.3'")
    return text


def check_mount_path(value: object) -> str:
    """Docker's ``-v SOURCE:TARGET`` syntax cannot carry a ``:`` or ``,`` in a path."""
    text = check_abs_path(value)
    if ":" in text or "," in text:
        raise InvalidValue(
            f"{quote(text)} cannot be bind-mounted by Docker (it contains ':' or ',')"
        )
    return text


def check_env_name(value: object) -> EnvName:
    text = _text(value)
    if not _ENV_NAME.fullmatch(text):
        raise InvalidValue(f"{quote(text)} is not a valid environment variable name")
    return text


def check_launch_env_name(value: object) -> LaunchEnvName:
    """A cluster or worker ``env`` key; the ones flodl's launcher sets per rank are refused."""
    text = check_env_name(value)
    if text in LAUNCHER_OWNED or text.startswith(LAUNCHER_OWNED_PREFIX):
        raise InvalidValue(
            f"{quote(text)} is reserved (the launcher sets it for each rank) and cannot be "
            "set through env"
        )
    return text


def check_service(value: object) -> ServiceName:
    text = _text(value)
    if not _SERVICE.fullmatch(text):
        raise InvalidValue(
            f"compose service {quote(text)} must be a service name of the project's "
            "docker compose file, such as 'cuda'"
        )
    return text


def check_ram_share(value: object) -> RamShare:
    """flodl's ``gpu_ram_share``: a share of host RAM (above 1 is allowed), finite, >= 0."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidValue(f"expected a number, got {_kind(value)}")
    if not math.isfinite(value) or value < 0:
        raise InvalidValue(
            f"must be a non-negative fraction of host RAM (e.g. 0.5), got {quote(value)}"
        )
    return float(value)


def check_env_value(value: object) -> EnvValue:
    """YAML turns ``1`` into an integer; an env value is text, so numbers are kept as text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return EnvValue(str(value))
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string or a number, got {_kind(value)}")
    if "\x00" in value:
        raise InvalidValue("an environment value cannot contain a NUL byte")
    return value


def check_port(value: object) -> Port:
    port = _strict_int(value, int)
    if not 0 < port < 65536:
        raise InvalidValue(f"expected a TCP port from 1 to 65535, got {port}")
    return port


def check_ssh_option(value: object) -> SshOption:
    """ssh_config style: ``Key=Value`` or ``Key Value``, as after ``ssh -o``."""
    text = _text(value)
    if split_ssh_option(text) is None:
        raise InvalidValue(
            f"ssh option {quote(text)} must look like 'Key=Value' (e.g. 'ProxyJump=bastion')"
        )
    return text


def _strict_int(value: object, _: type) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValue(f"expected an integer, got {_kind(value)}")
    return value


def _ignoring_type(check: Callable[[object], object]) -> Callable[[object, Any], object]:
    return lambda value, _: check(value)


def _is(kind: Any) -> Callable[[Any], bool]:
    """Annotated aliases are not classes, so hooks match them by equality."""
    return lambda candidate: bool(candidate == kind)


def _is_tuple(kind: Any) -> bool:
    return get_origin(kind) is tuple


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _ignoring_type(_text))
    checks: dict[Any, Callable[[object], object]] = {
        HostLabel: check_label,
        Arch: check_arch,
        AbsPath: check_abs_path,
        EnvName: check_env_name,
        EnvValue: check_env_value,
        LaunchEnvName: check_launch_env_name,
        ServiceName: check_service,
        CudaRelease: check_cuda_release,
        RamShare: check_ram_share,
        Port: check_port,
        SshOption: check_ssh_option,
        ImageTemplate: check_image,
        MountPath: check_mount_path,
    }
    for kind, check in checks.items():
        converter.register_structure_hook_func(_is(kind), _ignoring_type(check))
    converter.register_structure_hook(int, _strict_int)

    def tuple_hook(kind: Any) -> Callable[[object, Any], tuple[Any, ...]]:
        as_list = converter.get_structure_hook(list[get_args(kind)[0]])  # type: ignore[misc]

        def structure(value: object, _: Any) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise InvalidValue(f"expected a list, got {_kind(value)}")
            return tuple(as_list(value, list))

        return structure

    converter.register_structure_hook_factory(_is_tuple, tuple_hook)

    def class_hook(cls: type) -> Callable[[object, Any], Any]:
        structure_fields: Callable[[Any, Any], Any] = make_dict_structure_fn(
            cls, converter, _cattrs_forbid_extra_keys=True
        )

        def structure(value: object, _: Any) -> Any:
            if not isinstance(value, dict):
                raise InvalidValue(f"expected a mapping, got {_kind(value)}")
            return structure_fields(value, cls)

        return structure

    converter.register_structure_hook_factory(attrs.has, class_hook)
    builder_settings = converter.get_structure_hook(DockerSettings)

    def docker_or_compose(value: object, _: Any) -> DockerSettings | ComposeService | None:
        """flodl writes a compose service name; a mapping is a ``docker run`` setup."""
        if value is None:
            return None
        if isinstance(value, str):
            return ComposeService(check_service(value))
        return builder_settings(value, DockerSettings)  # type: ignore[no-any-return]

    converter.register_structure_hook(DockerSettings | ComposeService | None, docker_or_compose)
    return converter


CONVERTER = _make_converter()


def _describe(exc: BaseException, kind: Any) -> str:
    if isinstance(exc, InvalidValue):
        return str(exc)
    if isinstance(exc, ForbiddenExtraKeysError):
        known = ", ".join(a.name for a in attrs.fields(exc.cl))
        unknown = ", ".join(cut(k) for k in sorted(map(str, exc.extra_fields))[:MAX_PROBLEMS])
        return f"unknown key(s) {unknown}; expected one of: {known}"
    if isinstance(exc, KeyError):
        return "required key missing"
    return cattrs.v.format_exception(exc, kind)


def _readable(problem: str) -> str:
    """cattrs says ``msg @ $.workers[2].ssh.port``; we say ``workers[2].ssh.port: msg``."""
    message, _, path = problem.rpartition(" @ ")
    path = path.removeprefix("$").removeprefix(".")
    return f"{path or '(top level)'}: {message}"


def parse_cluster(data: object, source: str) -> Cluster:
    """Structure already-parsed YAML data; ``source`` names the file in errors."""
    if isinstance(data, dict) and set(data) == {"cluster"}:
        data = data["cluster"]
    if not isinstance(data, dict):
        raise FdlError(
            f"{source}: expected a mapping with 'controller' and 'workers', got {_kind(data)}"
        )
    try:
        cluster = CONVERTER.structure(data, Cluster)
    except (cattrs.BaseValidationError, InvalidValue) as exc:
        problems = (
            cattrs.transform_error(exc, path="$", format_exception=_describe)
            if isinstance(exc, cattrs.BaseValidationError)
            else [f"{exc} @ $"]
        )
        listed = [_readable(p) for p in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            listed.append(f"and {len(problems) - MAX_PROBLEMS} more problem(s)")
        raise FdlError(
            f"{source} is not a valid cluster file: " + "; ".join(listed) + "."
        ) from None
    if isinstance(cluster.controller.docker, DockerSettings) and (
        ":" in cluster.controller.path or "," in cluster.controller.path
    ):
        raise FdlError(
            f"{source} is not a valid cluster file: controller.path: "
            f"{cluster.controller.path!r} cannot be bind-mounted by Docker (it "
            "contains ':' or ','); move the project or build with native cargo."
        )
    seen: dict[str, int] = {}
    for index, worker in enumerate(cluster.workers):
        if worker.host in seen:
            raise FdlError(
                f"{source} is not a valid cluster file: workers[{index}].host: "
                f"host label {worker.host!r} is already used by "
                f"workers[{seen[worker.host]}]."
            )
        seen[worker.host] = index
    return cluster


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
