"""What the ``inv`` process needs around fdl-tasks' tasks, installed only when Invoke's
loader imports them (:func:`hook_command_line`): a broken configuration file of
Invoke's said as one paragraph, a reader that left stdout met quietly, a quicker exit.
Importing fdl-tasks into a program changes nothing.
"""

from __future__ import annotations

import atexit
import gc
import os
import select
import sys
import traceback
from pathlib import Path
from types import TracebackType

import yaml
from invoke.config import AmbiguousMergeError, Config
from invoke.loader import Loader
from invoke.vendor import yaml as invoke_yaml

from fdl_tasks.config.config_errors import merge_problem, not_a_mapping, value_at, yaml_problem


def config_file_problem(exc: BaseException, tb: TracebackType | None) -> str | None:
    """Invoke's reading of a configuration file failed (``invoke.yaml``, ``-f``'s): the
    problem as one paragraph, from the exception and the frames it passed through
    (``None``: not raised while Invoke's :class:`Config` read or merged a file)."""
    frames = [frame for frame, _ in traceback.walk_tb(tb)]
    in_config = [f for f in frames if isinstance(f.f_locals.get("self"), Config)]
    if not in_config:
        return None
    if isinstance(exc, yaml.YAMLError | invoke_yaml.YAMLError):  # Invoke reads with its own
        return yaml_problem(exc, "Invoke's configuration file")
    merging = [f for f in in_config if f.f_code.co_name == "_merge_file"]
    keys = [
        str(f.f_locals["key"])
        for f in frames
        if f.f_code.co_name == "merge_dicts" and "key" in f.f_locals
    ]
    config = merging[-1].f_locals["self"] if merging else None
    source = str(merging[-1].f_locals.get("name")) if merging else ""
    path = getattr(config, f"_{source}_path", None)
    data = getattr(config, f"_{source}", None)
    if isinstance(exc, AttributeError | TypeError) and path and not keys:
        return not_a_mapping(path, data)  # the whole file a string or a list
    if not isinstance(exc, AmbiguousMergeError):
        return None
    if not path:
        return f"Invoke's configuration cannot be merged: {exc}"
    found, value = value_at(data, keys)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        text = ""
    return merge_problem(path, text, keys, value if found else None)


def loaded_by_invoke() -> bool:
    """Whether Invoke's task loader is importing this (``inv`` starting, or another Invoke
    program loading a tasks file), not a program that imports fdl-tasks itself."""
    frames = traceback.walk_stack(sys._getframe(1))
    return any(isinstance(frame.f_locals.get("self"), Loader) for frame, _ in frames)


#: Whether :func:`pause_collection` turned the collector off, for :func:`hook_command_line`.
_paused_collection = False


def pause_collection() -> None:
    """While ``inv`` loads the tasks (Invoke's loader importing them), no cyclic garbage
    collection: the imports make only objects that live as long as the process, and
    the collector ran over them ~60 times, 13 ms of every ``inv``'s start
    (docs/numbers.md). :func:`hook_command_line` freezes them and turns it back on."""
    global _paused_collection
    if loaded_by_invoke() and gc.isenabled():
        gc.disable()
        _paused_collection = True


def hook_command_line() -> None:
    """What ``inv`` needs around its tasks, set for the whole process, so only when
    Invoke's loader imports the tasks: the one moment a command line is starting and no
    task can catch what follows.

    - Invoke reads its configuration files after importing the tasks, outside any task:
      a broken one would end ``inv`` in Invoke's traceback. Said as one paragraph, exit
      1; every other exception goes to the hook there was.
    - Output to a reader that has gone (``inv prebuild --help | head``) ends quietly,
      exit 1, not in a traceback, whether the write that finds it gone is a ``print``
      (:func:`reader_left`, from the hook) or the interpreter's last flush of a buffered
      stdout (:func:`flush_stdout`, an exit handler).
    - The interpreter's teardown collects garbage over every object the imports made:
      0.1 s of a 0.7 s no-op prebuild (measured, docs/numbers.md). Frozen at exit
      (:func:`gc.freeze` as an exit handler), they are skipped: a process that is ending
      gains nothing from the collection (the standard streams are flushed as before, and
      every file the tasks write is closed by then).
    - Frozen now too, as the tasks are loaded: the modules' objects live as long as the
      process, and a full collection during a run (one in each prebuild that builds,
      15 ms of CPU beside the builds) would walk all of them to find nothing.
    """
    if not loaded_by_invoke():
        return
    gc.freeze()
    if _paused_collection:
        gc.enable()
    atexit.register(gc.freeze)
    atexit.register(flush_stdout)
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, BrokenPipeError) and reader_left():
            return
        problem = config_file_problem(exc, tb)
        if problem is None:
            previous(kind, exc, tb)
            return
        print(f"fdl: {problem}", file=sys.stderr)

    sys.excepthook = hook


def reader_left() -> bool:
    """Whether stdout's reader has gone (a pipe whose read end is closed: ``| head`` that
    has read its lines). If so, stdout now writes to /dev/null, so that nothing left in
    its buffer fails again; a broken pipe elsewhere (a subprocess's stdin) is not this."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no stdout, or not a file
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
    return True


def flush_stdout() -> None:
    """Flush stdout before the interpreter does, so that a reader who left exits 1
    quietly, not as Python's "Exception ignored" and exit 120."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        if reader_left():
            os._exit(1)  # nothing more can be said; the exit handlers after this only flush
        raise
