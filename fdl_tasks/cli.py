"""How fdl-tasks' tasks meet the command line: flags, short flags, exits.

Every option is a flag (``--cmd X``, never a bare positional, so ``inv
prebuild --help`` is help); short flags are chosen, not automatic: one long
option has the same short flag in every task (:data:`SHORT_FLAGS`), or none.
A value Invoke cannot cast is a usage error, an :class:`FdlError` one
paragraph and exit code 1, a stop by the user (Ctrl-C, SIGTERM) exit code 130, a
failure or a stop that left a build container or process it could not remove exit code 3,
a host's ssh login misconfigured exit code 4, no host verified exit code 5.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.context import Context
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.tasks import Task, task

from fdl_tasks.errors import (
    FdlError,
    LeftRunning,
    LoginRefused,
    NothingVerified,
    Stopped,
    StoppedLeftRunning,
)
from fdl_tasks.names import check_command

F = TypeVar("F", bound=Callable[..., Any])

#: The only short flags: the same letter means the same option in every task.
SHORT_FLAGS = {"cmd": "c", "cluster-file": "f", "jobs": "j", "timeout": "t", "watch": "w"}


class CheckedArgument(Argument):
    """An option whose value Invoke casts (``--jobs abc``): a usage error, never a traceback."""

    def __repr__(self) -> str:  # Invoke names a flag given no value by its repr
        return f"--{self.name}"

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast)
        except ValueError:
            raise ParseError(f"--{self.name} expects a whole number, got {str(value)!r}") from None


class FdlTask(Task[Any]):
    """A task whose options all take flags (``--cmd X``, never a bare positional, so
    ``inv prebuild --help`` is help) and whose short flags come from :data:`SHORT_FLAGS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(positional=[], auto_shortflags=False)
        super().__init__(*args, **kwargs)

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(opts["names"][0])
        if short:
            opts["names"].append(short)
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        arguments: list[Argument] = super().get_arguments(ignore_unknown_help)
        for argument in arguments:
            argument.__class__ = CheckedArgument
        return arguments


def fdl_task(**options: Any) -> Callable[[F], FdlTask]:
    """``@task`` with :class:`FdlTask`, and :class:`FdlError` / stops turned into exits."""

    def decorate(body: F) -> FdlTask:
        made: FdlTask = task(klass=FdlTask, **options)(user_errors(body))
        return made

    return decorate


def off(flag: bool) -> bool | None:
    """A ``--no-…`` option as a settings override: ``False`` when given, else the setting."""
    return False if flag else None


def user_errors(body: F) -> F:
    """Turn :class:`FdlError` into a clean message and exit 1, a stop into exit 130, and
    either into exit 3 when it left a container or process it could not remove; a refused
    login exits 4, no host verified 5."""

    @functools.wraps(body)
    def wrapper(c: Context, *args: Any, **kwargs: Any) -> Any:
        try:
            return body(c, *args, **kwargs)
        except (LeftRunning, StoppedLeftRunning) as exc:
            raise Exit(f"fdl: {exc}", code=3) from None
        except LoginRefused as exc:
            raise Exit(f"fdl: {exc}", code=4) from None
        except NothingVerified as exc:
            raise Exit(f"fdl: {exc}", code=5) from None
        except FdlError as exc:
            raise Exit(f"fdl: {exc}", code=1) from None
        except Stopped as exc:
            raise Exit(f"fdl: {exc}", code=130) from None
        except KeyboardInterrupt:
            raise Exit("fdl: interrupted", code=130) from None

    return wrapper  # type: ignore[return-value]


def require_command(cmd: str | None) -> str:
    if not cmd:
        raise FdlError("--cmd is required: the command (cargo --bin name) to build or run")
    return check_command(cmd)
