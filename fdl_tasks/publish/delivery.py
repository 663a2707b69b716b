"""Copy delivery, pure part: which hosts get an upload, where, and what each host answered.

A ``copy`` host does not see the project: the binary is uploaded to
``<worker.path>/<bin>``. One round trip per host first creates the
directories (the binary's and the command's working directory), removes
temporary files an interrupted upload left, and reports the copy's sha256,
the free space and whether the directory is writable; :func:`decide` turns
that answer into nothing to send, an upload, or one clear error.

A host that refuses SFTP gets the bytes on the stdin of :func:`stream_script`
instead, over the ssh exec channel the query already used; :func:`stream_problem`
reads its answer.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import attrs

from fdl_tasks.config.model import Cluster, Worker
from fdl_tasks.config.names import join_path
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.ssh.answers import BEGIN, END, marked_answers

#: Marks a file being uploaded: ``.<bin>.fdl-part-<token>`` beside the final path.
PART_INFIX = ".fdl-part-"


def copy_hosts(cluster: Cluster, workers: Iterable[Worker]) -> list[Worker]:
    """The workers whose own ``delivery``, else the cluster's, is ``copy``."""
    return [w for w in workers if (w.delivery or cluster.delivery) == "copy"]


@attrs.frozen(kw_only=True)
class Target:
    """One host's upload: the controller's built file and the host's paths."""

    host: str
    source: Path
    sha256: str
    size: int
    final: str  # <worker.path>/<bin>
    workdir: str  # <worker.path>/<cwd_subpath>

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.final)

    def part(self, token: str) -> str:
        """A temporary name in the final directory, so the rename is atomic."""
        return join_path(self.directory, f".{posixpath.basename(self.final)}{PART_INFIX}{token}")


def target_for(worker: Worker, entry: PerHostEnvelope, source: Path, sha256: str) -> Target:
    return Target(
        host=worker.host,
        source=source,
        sha256=sha256,
        size=source.stat().st_size,
        final=join_path(worker.path, entry.bin),
        workdir=join_path(worker.path, entry.cwd_subpath),
    )


def query_script(target: Target) -> str:
    """Create the directories, drop stale parts, report sha256, free KiB, writability."""
    directory, final = shlex.quote(target.directory), shlex.quote(target.final)
    workdir = shlex.quote(target.workdir)
    parts = shlex.quote(target.part("")) + "*"
    return "\n".join(
        [
            f"echo {BEGIN}",
            f"if __fdl_err=$(mkdir -p -- {directory} {workdir} 2>&1); then echo mkdir=ok; "
            "else printf 'mkdir=%s\\n' \"$(printf '%s' \"$__fdl_err\" | head -n 1)\"; fi",
            f"if [ -d {directory} ] && [ -w {directory} ]; then echo writable=yes; "
            "else echo writable=no; fi",
            f"rm -f -- {parts} 2>/dev/null",
            f"if [ -f {final} ]; then echo \"sha256=$(sha256sum {final} | cut -d' ' -f1)\"; "
            "else echo sha256=missing; fi",
            f"printf 'free_kib=%s\\n' \"$(df -Pk {directory} 2>/dev/null | "
            "awk 'NR==2{print $4}')\"",
            f"echo {END}",
            "exit 0",
        ]
    )


@attrs.frozen
class HostState:
    """What the host answered before any upload."""

    mkdir: str  # "ok", or the first line of mkdir's error
    writable: bool
    sha256: str | None
    free_bytes: int | None


def parse_state(stdout: str) -> HostState | None:
    answers = marked_answers(stdout)
    if answers is None or answers.get("mkdir") is None:
        return None
    sha = answers.get("sha256")
    free = answers.get("free_kib") or ""
    return HostState(
        mkdir=answers.get("mkdir") or "",
        writable=answers.get("writable") == "yes",
        sha256=None if sha in (None, "missing") else sha,
        free_bytes=int(free) * 1024 if free.isdigit() else None,
    )


@attrs.frozen
class Decision:
    """``skip`` (the host holds these bytes), ``send``, or ``error`` with its message."""

    action: Literal["skip", "send", "error"]
    message: str = ""


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def decide(target: Target, state: HostState) -> Decision:
    """Send only what is missing; refuse early what cannot fit or cannot be written."""
    if state.sha256 == target.sha256:
        return Decision("skip")
    where = f"{target.host}: {target.directory}"
    if state.mkdir != "ok":
        return Decision("error", f"{where} cannot be created: {state.mkdir}")
    if not state.writable:
        return Decision("error", f"{where} is not writable by the ssh user")
    if state.free_bytes is not None and state.free_bytes < target.size:
        return Decision("error", no_space(target, state.free_bytes))
    return Decision("send")


def write_failed(target: Target, state: HostState, why: str) -> str:
    """A write that failed mid-way (often a disk filled by another writer): the bytes
    needed and the space there was."""
    free = "" if state.free_bytes is None else f", {megabytes(state.free_bytes)} free before"
    return (
        f"{target.host}: writing {target.final} failed ({why}); the binary needs "
        f"{target.size} bytes ({megabytes(target.size)}){free}"
    )


def stream_script(target: Target, part: str, stale: Sequence[str]) -> str:
    """Receive the binary on stdin into ``part``; keep it only whole and with the expected
    sha256, executable, renamed over the final path (``mv -f``, an atomic ``rename(2)``).

    Short input (the controller stopped, the connection dropped) fails the checks, so
    the host removes the part itself. ``stale`` are parts of a dropped attempt.
    """
    q = shlex.quote(part)
    drop = f"rm -f -- {q}"
    lines = [f"rm -f -- {' '.join(map(shlex.quote, stale))}"] if stale else []
    return "\n".join(
        [
            *lines,
            "umask 077",
            f"if ! cat > {q}; then {drop}; echo received=unwritten; exit 1; fi",
            f"size=$(wc -c < {q} | tr -d ' ')",
            f"sum=$(sha256sum {q} | cut -d' ' -f1)",
            f'if [ "$size" != {target.size} ] || [ "$sum" != {shlex.quote(target.sha256)} ]',
            f'then {drop}; echo "received=$size sha256=$sum"; exit 3; fi',
            f"if ! {{ chmod 755 {q} && mv -f -- {q} {shlex.quote(target.final)}; }}",
            f"then {drop}; echo received=unwritten; exit 1; fi",
            "echo received=ok",
        ]
    )


_RECEIVED = re.compile(r"^received=(\S*)(?: sha256=(\S*))?$", re.MULTILINE)


def stream_problem(
    target: Target, state: HostState, exited: int, stdout: str, stderr: str
) -> str | None:
    """What went wrong in :func:`stream_script`, as one line; ``None``: the file is in place.

    No ``received=`` answer means the exec channel did not run the script as written.
    """
    said = stderr.strip().splitlines()
    answer = _RECEIVED.search(stdout)
    if answer is None:
        return refused_both(target.host, ": ".join([f"exit {exited}", *said[-1:]]))
    size, sha = answer.groups()
    if size == "ok":
        return None
    if size == "unwritten":
        return write_failed(target, state, said[-1] if said else f"exit {exited}")
    return write_failed(
        target,
        state,
        f"{size or 'no'} bytes arrived with sha256 {sha or 'none'}, "
        f"{target.size} were sent with sha256 {target.sha256}",
    )


def refused_both(host: str, why: str) -> str:
    return (
        f"{host}: the host refuses SFTP, and the ssh exec channel failed too ({why}): "
        "the binary could not be sent"
    )


def no_space(target: Target, free: int | None) -> str:
    have = f"{megabytes(free)} free" if free is not None else "the disk is full"
    return (
        f"{target.host}: not enough space in {target.directory}: the binary needs "
        f"{target.size} bytes ({megabytes(target.size)}), {have}"
    )
