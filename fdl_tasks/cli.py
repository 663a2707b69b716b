"""How fdl-tasks' tasks meet the command line: flags, short flags, exits.

Every option is a flag (``--cmd X``, never a bare positional, so ``inv
prebuild --help`` is help); short flags are chosen, not automatic: one long
option has the same short flag in every task (:data:`SHORT_FLAGS`), or none.
A value Invoke cannot cast is a usage error, an :class:`FdlError` one
paragraph and exit code 1, a stop by the user (Ctrl-C, SIGTERM) exit code 130, a
failure or a stop that left a build container or process it could not remove exit code 3,
a host's ssh login misconfigured exit code 4, no host verified exit code 5.

What a command-line program needs beyond that is installed only when there is
one: SIGTERM as Ctrl-C while a task runs (:func:`user_errors`); what the ``inv``
process needs around the tasks is :mod:`fdl_tasks.inv_process`'s.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from invoke.context import Context
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.tasks import Task, task

from fdl_tasks.config.names import check_command
from fdl_tasks.core.errors import (
    FdlError,
    LeftRunning,
    LoginRefused,
    NothingVerified,
    ProgramExited,
    Stopped,
    StoppedLeftRunning,
)
from fdl_tasks.core.interrupts import as_program

F = TypeVar("F", bound=Callable[..., Any])

#: The only short flags: the same letter means the same option in every task.
SHORT_FLAGS = {
    "cmd": "c",
    "cluster-file": "f",
    "jobs": "j",
    "timeout": "t",
    "verbose": "v",
    "watch": "w",
}


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
        if short := SHORT_FLAGS.get(opts["names"][0]):
            opts["names"].append(short)
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        arguments: list[Argument] = super().get_arguments(ignore_unknown_help)
        for argument in arguments:
            argument.__class__ = CheckedArgument
        return arguments


class ClusterChoice(TypedDict):
    """The options every task takes: the cluster file (and flodl env) to read, and which of
    its hosts this machine is, as :meth:`~fdl_tasks.config.run.Run.start`'s keywords. A task
    body's ``where`` parameter is these three flags."""

    cluster_file: str | None
    env: str | None
    controller_host: str | None


#: The help of the options several tasks share; a task's own ``help`` adds the rest.
SHARED_HELP = {
    "cluster-file": "the cluster file to read (default: fdl.cluster_file, else cluster.yaml "
    "in the project root, else the flodl project's fdl.yml with its env overlay)",
    "env": "the flodl env whose overlay fdl.<env>.yml holds the cluster block (default: "
    "$FDL_ENV, else fdl.env, else cluster)",
    "controller-host": "this machine's host label (default: $FLODL_HOST_NAME, else hostname)",
    "json": "print a machine-readable result on stdout",
    "cmd": "the command to build (cargo --bin name); required",
    "crate-dir": "crate directory relative to controller.path (default: <cmd>/ if it holds "
    "a Cargo.toml, else the project root)",
    "no-cache": "build without the compile cache (sccache): no compiled crate is shared "
    "between target dirs; each still rebuilds only what changed (cargo's fingerprints)",
    "no-warm": "a new container per docker build (docker run --rm), as before warm build "
    "containers (default: fdl.warm_containers)",
    "verbose": "every note, also those an earlier run said already (default: fdl.verbose)",
    "plain": "plain lines even on a terminal: no live progress region, no escape codes "
    "(default: fdl.plain; output that is not a terminal is always plain)",
    "timings": "write an HTML timeline of the run (with cargo's --timings report of each "
    "build) under target/cluster/_timings/ (default: fdl.timings)",
}


CHOICE_FLAGS = {"cluster-file", "env", "controller-host"}


def fdl_task(**options: Any) -> Callable[[F], FdlTask]:
    """``@task`` with :class:`FdlTask`, a ``where`` parameter as :class:`ClusterChoice`'s flags,
    and :class:`FdlError` / stops turned into exits."""

    def decorate(body: F) -> FdlTask:
        taken = {n.replace("_", "-") for n in inspect.signature(body).parameters} | CHOICE_FLAGS
        shared = {name: text for name, text in SHARED_HELP.items() if name in taken}
        options["help"] = {**shared, **options.get("help", {})}
        made: FdlTask = task(klass=FdlTask, **options)(user_errors(with_cluster_choice(body)))
        return made

    return decorate


def with_cluster_choice(body: F) -> F:
    """``body`` as Invoke sees a task taking ``--cluster-file``, ``--env`` and
    ``--controller-host``, called with them packed into its ``where``."""
    signature = inspect.signature(body)
    names = list(ClusterChoice.__annotations__)
    flags = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for n in names
    ]
    context, *rest = (p for p in signature.parameters.values() if p.name != "where")

    @functools.wraps(body)
    def wrapper(c: Context, **kwargs: Any) -> Any:
        where = ClusterChoice(**{n: kwargs.pop(n, None) for n in names})  # type: ignore[typeddict-item]
        return body(c, where=where, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[context, *flags, *rest])  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def off(flag: bool) -> bool | None:
    """A ``--no-…`` option as a settings override: ``False`` when given, else the setting."""
    return False if flag else None


def user_errors(body: F) -> F:
    """Turn :class:`FdlError` into a clean message and exit 1, a stop into exit 130, and
    either into exit 3 when it left a container or process it could not remove; a refused
    login exits 4, no host verified 5. The body runs :func:`as_program`: a task is the
    program, whose SIGTERM stops it as Ctrl-C does."""

    @functools.wraps(body)
    def wrapper(c: Context, *args: Any, **kwargs: Any) -> Any:
        try:
            with as_program():
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
        except ProgramExited as exc:
            raise Exit(code=exc.code) from None

    return wrapper  # type: ignore[return-value]


def require_command(cmd: str | None) -> str:
    if not cmd:
        raise FdlError("--cmd is required: the command (cargo --bin name) to build or run")
    return check_command(cmd)
