"""The one cattrs converter: every structure from outside data goes through it.

It is strict where YAML and JSON are lax (a port must be an integer, a list a
list, a string a string), applies the single-value checks of
:mod:`fdl_tasks.config.values` to the model's kinds, and reports every problem with
its key path (``workers[2].ssh.port: expected an integer``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from fdl_tasks.config.dist_settings import DIST_CHECKS
from fdl_tasks.config.model import NOT_IN_FILE, ComposeService, DockerSettings
from fdl_tasks.config.setting_values import SETTING_CHECKS
from fdl_tasks.config.values import (
    CHECKS,
    InvalidValue,
    check_int,
    check_service,
    check_text,
    cut,
    kind_of,
    quote,
)
from fdl_tasks.core.errors import FdlError

T = TypeVar("T")
#: Keys holding these are quoted with escapes in messages, so a message stays one line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")
#: How many problems one message lists.
MAX_PROBLEMS = 8


def _with_check(check: Callable[[object], object]) -> Callable[[object, Any], object]:
    return lambda value, _: check(value)


def _equal_to(kind: Any) -> Callable[[Any], bool]:
    """Annotated aliases are not classes, so hooks match them by equality."""
    return lambda candidate: bool(candidate == kind)


def _is_tuple(kind: Any) -> bool:
    return get_origin(kind) is tuple


def mapping_hook(
    converter: cattrs.Converter, cls: type, forbid_extra_keys: bool
) -> Callable[[object, Any], Any]:
    """Structure an attrs class from a mapping, and say so when it is something else."""
    hidden: dict[str, Any] = {
        f.name: override(omit=True) for f in attrs.fields(cls) if f.metadata.get(NOT_IN_FILE)
    }
    structure_fields: Callable[[Any, Any], Any] = make_dict_structure_fn(
        cls, converter, _cattrs_forbid_extra_keys=forbid_extra_keys, **hidden
    )

    def structure(value: object, _: Any) -> Any:
        if not isinstance(value, dict):
            raise InvalidValue(f"expected a mapping, got {kind_of(value)}")
        return structure_fields(value, cls)

    return structure


def _make_converter() -> cattrs.Converter:
    """The whole configuration, here and nowhere else: no module adds hooks on import."""
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _with_check(check_text))
    converter.register_structure_hook(int, _with_check(check_int))
    for kind, check in {**CHECKS, **SETTING_CHECKS, **DIST_CHECKS}.items():  # each kind's check
        converter.register_structure_hook_func(_equal_to(kind), _with_check(check))

    def tuple_hook(kind: Any) -> Callable[[object, Any], tuple[Any, ...]]:
        as_list = converter.get_structure_hook(list[get_args(kind)[0]])  # type: ignore[misc]

        def structure(value: object, _: Any) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise InvalidValue(f"expected a list, got {kind_of(value)}")
            return tuple(as_list(value, list))

        return structure

    converter.register_structure_hook_factory(_is_tuple, tuple_hook)

    def class_hook(cls: type) -> Callable[[object, Any], Any]:
        lenient = bool(getattr(cls, "lenient", False))  # a class may ignore unknown keys
        return mapping_hook(converter, cls, forbid_extra_keys=not lenient)

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
        known = ", ".join(a.name for a in attrs.fields(exc.cl) if not a.metadata.get(NOT_IN_FILE))
        names = sorted(map(str, exc.extra_fields))[:MAX_PROBLEMS]
        unknown = ", ".join(quote(k) if _CONTROL.search(k) else cut(k) for k in names)
        return f"unknown key(s) {unknown}; expected one of: {known}"
    if isinstance(exc, KeyError):
        return "required key missing"
    return cattrs.v.format_exception(exc, kind)


def _problems(exc: BaseException) -> list[tuple[str, str]]:
    """Every problem as (key path, message).

    cattrs renders each as ``<message> @ <path>``; both halves may quote user
    text holding ``" @ "``, so the messages are kept aside and cattrs is given
    only their numbers to render.
    """
    if not isinstance(exc, cattrs.BaseValidationError):
        return [("$", str(exc))]
    messages: list[str] = []

    def numbered(error: BaseException, kind: Any) -> str:
        messages.append(_describe(error, kind))
        return str(len(messages) - 1)

    rendered = cattrs.transform_error(exc, path="$", format_exception=numbered)
    split = (line.partition(" @ ") for line in rendered)
    return [(path, messages[int(number)]) for number, _, path in split]


def _readable(path: str, message: str) -> str:
    """``workers[2].ssh.port: msg``; a predicate (``must be …``) follows its path directly."""
    path = path.removeprefix("$").removeprefix(".") or "(top level)"
    return f"{path} {message}" if message.startswith("must ") else f"{path}: {message}"


def structure(data: object, cls: type[T], what: str, root: str = "") -> T:
    """``data`` as a ``cls``, or one :class:`FdlError`: ``<what>: <root><path>: <problem>; …``."""
    try:
        return CONVERTER.structure(data, cls)
    except (cattrs.BaseValidationError, InvalidValue) as exc:
        problems = _problems(exc)
        listed = [root + _readable(path, text) for path, text in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            listed.append(f"and {len(problems) - MAX_PROBLEMS} more problem(s)")
        raise FdlError(f"{what}: " + "; ".join(listed) + ".") from None
