"""cluster.yaml in, a validated :class:`~fdl_tasks.model.Cluster` out.

One cattrs converter does all structuring. It is strict where YAML is lax
(a port must be an integer, a list must be a list, a string a string) and
every problem is reported with its key path, e.g. ``workers[2].ssh.port``.
"""

from __future__ import annotations

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
    EnvName,
    EnvValue,
    HostLabel,
    ImageTemplate,
    MountPath,
    Port,
    SshOption,
)
from fdl_tasks.rules import CUDA_TAG_FIELD, CUDA_VERSION_FIELD, split_ssh_option

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ARCH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InvalidValue(ValueError):
    """A value of the right shape but not acceptable; its text is shown as is."""


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {_kind(value)}")
    if _CONTROL.search(value):
        raise InvalidValue(f"{value!r} contains a control character")
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
    return f"{names.get(type(value), type(value).__name__)} ({value!r})"


def check_label(value: object) -> HostLabel:
    """A host label is a path segment: letters, digits, ``.``, ``_``, ``-``."""
    text = _text(value)
    if not _LABEL.fullmatch(text):
        raise InvalidValue(
            f"host label {text!r} must start with a letter or digit and hold only "
            "letters, digits, '.', '_' and '-' (it becomes a directory name)"
        )
    return text


def check_arch(value: object) -> Arch:
    """An arch is a relative path under ``libtorch/`` that cannot escape it."""
    text = _text(value)
    segments = text.split("/")
    if text.startswith("/") or not all(_ARCH_SEGMENT.fullmatch(s) for s in segments):
        raise InvalidValue(
            f"arch {text!r} must be a relative path under libtorch/ such as "
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
        raise InvalidValue(f"expected an absolute path, got {text!r}")
    return text


def check_image(value: object) -> str:
    """An image name, whose only template fields are ``{cuda_version}`` and ``{cuda_tag}``."""
    text = _text(value)
    bare = text.replace(CUDA_VERSION_FIELD, "").replace(CUDA_TAG_FIELD, "")
    if not text or text.startswith("-") or any(c in bare for c in "{} \t"):
        raise InvalidValue(
            f"image {text!r} must be an image name such as 'flodl-cuda:{{cuda_tag}}': no "
            "spaces, no leading '-', and no template fields but {cuda_version} and {cuda_tag}"
        )
    return text


def check_mount_path(value: object) -> str:
    """Docker's ``-v SOURCE:TARGET`` syntax cannot carry a ``:`` or ``,`` in a path."""
    text = check_abs_path(value)
    if ":" in text or "," in text:
        raise InvalidValue(f"{text!r} cannot be bind-mounted by Docker (it contains ':' or ',')")
    return text


def check_env_name(value: object) -> EnvName:
    text = _text(value)
    if not _ENV_NAME.fullmatch(text):
        raise InvalidValue(f"{text!r} is not a valid environment variable name")
    return text


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
            f"ssh option {text!r} must look like 'Key=Value' (e.g. 'ProxyJump=bastion')"
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
    return converter


CONVERTER = _make_converter()


def _describe(exc: BaseException, kind: Any) -> str:
    if isinstance(exc, InvalidValue):
        return str(exc)
    if isinstance(exc, ForbiddenExtraKeysError):
        known = ", ".join(a.name for a in attrs.fields(exc.cl))
        unknown = ", ".join(sorted(exc.extra_fields))
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
        raise FdlError(
            f"{source} is not a valid cluster file: "
            + "; ".join(_readable(p) for p in problems)
            + "."
        ) from None
    if cluster.controller.docker and (
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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FdlError(f"{source} is not valid YAML{where}: {problem}.") from None
    return parse_cluster(data, source)
