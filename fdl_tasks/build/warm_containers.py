"""Warm build containers: one long-lived container per build's ``docker run`` options,
each build a ``docker exec`` of the same command in it.

Pure logic: the container's name and labels, the digest that decides whether a
running container may serve a build, the lines that create it, run a build in it
and stop a build in it. The I/O is :mod:`fdl_tasks.build.warm_containers_io`.

A warm container is created with exactly the options a build's ``docker run``
gets (mounts, user, environment, working directory, the user's ``run_args``),
so a ``docker exec`` of the build's command sees what ``docker run`` would have
shown it. What a ``docker run`` reads at start only (the image, each bind
source's inode, what is mounted under one, the client's variables named by
``-e NAME``, an ``--env-file``) is in the digest, and the digest is in the name:
a container whose inputs changed is never reused.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable, Sequence

import attrs

from fdl_tasks.core.standbys import BEGAN

#: Every warm container carries these; the project's path, the job, the image's id, the digest.
WARM_LABEL = "fdl-tasks.warm"
WARM_JOB_LABEL = "fdl-tasks.warm.job"
WARM_IMAGE_LABEL = "fdl-tasks.warm.image"
#: ``docker run`` options a warm container cannot honour as a ``docker run`` would: each
#: ``docker exec`` would skip an entrypoint; the others conflict with ``-d --rm``.
COLD_OPTIONS = ("--entrypoint", "-t", "--tty", "-i", "--interactive", "-a", "--attach")
#: Options whose value is a host path read when the container starts.
_MOUNT_OPTIONS = {"-v": "volume", "--volume": "volume", "--mount": "mount"}
_ENV_OPTIONS = ("-e", "--env")
#: Where a warm container of a ``docker run`` build sees its project's parked standbys
#: (:mod:`fdl_tasks.build.parked_standbys`): one directory per container, named after it.
PARK_MOUNT = "/fdl-standby"


@attrs.frozen
class WarmSettings:
    """Warm containers on, and how long one waits for its next build before it stops."""

    idle_seconds: int


def keeper(idle_seconds: int) -> str:
    """The container's main process (its PID 1): it exits, stopping the container (``--rm``
    then removes it), after ``idle_seconds`` in which no other process ran in it.

    It counts seconds in which ``/proc`` shows no process but itself (no ``docker
    exec`` running), so a long build never counts as idle and nothing outside the
    container (no ``inv``) has to be alive. A parked standby waiting in
    :data:`PARK_MOUNT` (:data:`PARK`) is not work. As PID 1 it also reaps what a
    build orphans (dash and bash wait for any child).
    """
    return (
        "trap 'exit 0' TERM INT; idle=0; "
        f"while [ $idle -lt {int(idle_seconds)} ]; do sleep 1; idle=$((idle + 1)); "
        "for p in /proc/[0-9]*; do [ ${p#/proc/} = 1 ] || "
        f"[ $p/cwd -ef {PARK_MOUNT} ] || idle=0; done; done"
    )


#: Run in the container by a stop: kill every process but PID 1 (the keeper) and itself,
#: i.e. the build (cargo, rustc, build scripts, an sccache server): one build at a time
#: runs in a container (its target dir is its own, and builds run under the project lock).
#: Then up to 5 s for them to be gone (a zombie is gone: its parent has yet to reap it;
#: so is the keeper's own ``sleep``); exit 1 if one is still there.
KILL_BUILDS = (
    "for p in /proc/[0-9]*; do p=${p#/proc/}; "
    '[ "$p" = 1 ] || [ "$p" = $$ ] || kill -KILL "$p" 2>/dev/null; done; '
    "n=0; while [ $n -lt 50 ]; do left=; for p in /proc/[0-9]*; do "
    'q=${p#/proc/}; [ "$q" = 1 ] || [ "$q" = $$ ] && continue; s=; '
    '{ read -r s < "$p/stat"; } 2>/dev/null; '
    'case "$s" in ""|*") Z "*|*" (sleep) S 1 "*) ;; *) left=$q;; esac; '
    'done; [ -z "$left" ] && exit 0; sleep 0.1; n=$((n + 1)); done; exit 1'
)


def cold_reason(options: Sequence[str]) -> str | None:
    """Why a build with these ``docker run`` options must run in a container of its own
    (``None`` when a warm one serves it as well)."""
    for option in options:
        name = option.split("=", 1)[0]
        flags = set(name[1:]) if re.fullmatch(r"-[a-zA-Z]{2,}", name) else set()
        if name in COLD_OPTIONS or flags & {"t", "i", "a"}:
            return f"its docker options include {option!r}"
    return None


def bind_sources(options: Sequence[str], *, env_files: bool = False) -> list[str]:
    """The host paths a container binds (``-v``/``--volume`` absolute sources, ``--mount``
    ``source=``), in order; with ``env_files``, the ``--env-file`` paths instead."""
    found, files, args = [], [], list(options)
    while args:
        arg = args.pop(0)
        name, equals, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name.startswith("-v") and not name.startswith("--") and len(name) > 2:
            name, value, equals = "-v", name[2:], "="
        if name in (*_MOUNT_OPTIONS, "--env-file") and not equals:
            value = args.pop(0) if args else ""
        kind = _MOUNT_OPTIONS.get(name)
        if kind == "volume" and value.startswith("/"):
            found.append(value.split(":", 1)[0])
        elif kind == "mount":
            fields = dict(f.partition("=")[::2] for f in value.split(","))
            source = fields.get("source") or fields.get("src") or ""
            if source.startswith("/"):
                found.append(source)
        elif name == "--env-file" and value:
            files.append(value)
    return files if env_files else found


def client_variables(options: Sequence[str]) -> list[str]:
    """Names given as ``-e NAME`` (no value): the docker client passes its own value."""
    names, args = [], list(options)
    while args:
        arg = args.pop(0)
        if arg in _ENV_OPTIONS:
            value = args.pop(0) if args else ""
        elif arg.startswith("--env="):
            value = arg[len("--env=") :]
        elif arg.startswith("-e") and len(arg) > 2:
            value = arg[2:]
        else:
            continue
        if "=" not in value:
            names.append(value)
    return names


def spec_digest(root: str, image_id: str, options: Sequence[str], seen: Sequence[str]) -> str:
    """What a warm container stands for: the project, the image's content id, every
    ``docker run`` option, and ``seen`` (what those options read at start, as
    :func:`fdl_tasks.build.warm_containers_io.start_inputs` found it)."""
    text = "\0".join([root, image_id, *options, "\0", *seen])
    return hashlib.sha256(text.encode()).hexdigest()


def warm_name(digest: str) -> str:
    """The container's name: its digest's, so two runs that want one container race for
    one name (Docker lets one create it) and a changed input is another name."""
    return f"fdl-warm-{digest[:20]}"


def identity(name: str, root: str, job: str, image_id: str) -> list[str]:
    """The container's name and labels, as ``docker run`` and ``compose run`` take them."""
    labels = {WARM_LABEL: root, WARM_JOB_LABEL: job, WARM_IMAGE_LABEL: image_id}
    return ["--name", name, *(f"--label={key}={value}" for key, value in labels.items())]


#: Builds a container's start line from its :func:`identity` and its main process's argv.
Start = Callable[[Sequence[str], Sequence[str]], str]


def run_start(options: Sequence[str]) -> Start:
    """``docker run -d --rm`` of the keeper with a build's own options (the image last)."""
    return lambda ids, main: shlex.join(["docker", "run", "-d", "--rm", *ids, *options, *main])


def keeper_argv(settings: WarmSettings) -> list[str]:
    return ["sh", "-c", keeper(settings.idle_seconds)]


#: Before each build in a warm container: what a new container would not have. The last
#: build's sccache server was stopped, but its socket file stays, and a build would
#: find it as a server that runs (and ask it for counts, starting one).
FRESH = '[ -z "${SCCACHE_SERVER_UDS:-}" ] || rm -f "$SCCACHE_SERVER_UDS"; exec "$@"'


def exec_argv(command: Sequence[str]) -> list[str]:
    """The build in its container: the same command a ``docker run`` would start (through
    :data:`FRESH`)."""
    return ["sh", "-c", FRESH, "sh", *command]


def exec_line(name: str, command: Sequence[str]) -> str:
    """The build as a ``docker exec`` of :func:`exec_argv`."""
    return shlex.join(["docker", "exec", name, *exec_argv(command)])


#: A standby in a warm container (:mod:`fdl_tasks.core.standbys`): it reads the build's
#: argv, quoted as one shell line, to the end of its stdin, says it begins (``BEGAN``, on
#: stderr) and runs it as :func:`exec_line` would (stdin empty); nothing read is nothing
#: run, exit 0. A shell without ``cat`` ends it at once: the build runs as a ``docker
#: exec`` then.
STANDBY = (
    "command -v cat >/dev/null 2>&1 || exit 0; argv=$(cat) || exit 126; "
    f'[ -n "$argv" ] || exit 0; echo {shlex.quote(BEGAN.strip())} >&2; '
    'eval "exec $argv" </dev/null'
)


def standby_line(name: str) -> str:
    """A standby's ``docker exec``: stdin attached, the build's argv to come on it."""
    return shlex.join(["docker", "exec", "-i", name, "sh", "-c", STANDBY])


#: What a parked shell says on ``out`` as a claimer opens it: it is there.
PARKED = "parked\n"
#: The line a claimer ends a command with: a command cut short (its writer died) lacks it.
PARK_END = "# fdl-tasks: the command is whole"

#: A standby parked by one prebuild for the next: started with ``docker exec -d`` (no
#: client waits with it), it says it is ``ready`` in its slot in :data:`PARK_MOUNT`
#: (where the keeper does not count it as work), waits for a claimer to open the FIFO
#: ``out`` and says :data:`PARKED` there, reads its command from the FIFO ``go``, and
#: runs it only if it ends with :data:`PARK_END`: it says it begins, runs the command
#: in the exec's own working directory and leaves its exit status in ``status``.
PARK = (
    f"w=$PWD; cd {PARK_MOUNT} || exit 0; "
    ': >"$1/ready" || exit 0; exec >"$1/out" 2>&1 </dev/null; '
    f"printf %s {shlex.quote(PARKED)}; "
    'argv=$(cat "$1/go") || exit 0; '
    f'case $argv in *{shlex.quote(PARK_END)}) ;; *) exit 0 ;; esac; cd "$w" || exit 126; '
    f"echo {shlex.quote(BEGAN.strip())} >&2; "
    f'eval "$argv"; echo $? >"{PARK_MOUNT}/$1/status"'
)


def park_argv(name: str) -> list[str]:
    """A standby parked in container ``name``, in the directory named after it."""
    return ["docker", "exec", "-d", name, "sh", "-c", PARK, "sh", name]


def gone_reason(last_used: float | None, now: float, settings: WarmSettings) -> str | None:
    """Why the container a build used last is not there any more, when it was not its
    idle timeout (``None``: never made, or it stopped itself, as it should)."""
    if last_used is None or now - last_used >= settings.idle_seconds:
        return None
    return "the Docker daemon restarted, or it was stopped or removed by hand"


def running(container: dict[str, object] | None) -> bool:
    """Whether an inspected container (``None``: none) is running."""
    state = container.get("State") if container else None
    return isinstance(state, dict) and state.get("Status") == "running"
