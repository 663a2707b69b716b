"""Copy delivery over the Fleet's own connections: one query round trip, SFTP uploads.

Each upload writes a temporary name beside the final path and renames it
(``posix-rename@openssh.com``, an atomic ``rename(2)`` on the host): a binary
running there keeps its inode, and nothing can exec half a file. A dropped
connection is retried once on a fresh one; every other failure is that host's
error, and the other hosts still finish.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import attrs
import paramiko

from fdl_tasks.binary_check import file_sha256
from fdl_tasks.copy_plan import (
    HostState,
    Target,
    copy_hosts,
    decide,
    megabytes,
    parse_state,
    query_script,
    target_for,
)
from fdl_tasks.envelope import PerHostEnvelope
from fdl_tasks.errors import FdlError, Stopped
from fdl_tasks.outcomes import Failure
from fdl_tasks.remote import Fleet
from fdl_tasks.run import Run
from fdl_tasks.settings import Settings

BLOCK = 1 << 20


@attrs.frozen(kw_only=True)
class Copies:
    """Bytes sent per host, hosts already current, and every error (a host not reached
    is one: the copy it holds may be stale, and an envelope would point a launcher at it)."""

    sent: Mapping[str, int]
    current: tuple[str, ...]
    problems: tuple[str, ...]

    def summary(self) -> str:
        total = sum(self.sent.values())
        return (
            f"{len(self.sent)} host(s) sent {megabytes(total)} ({total} bytes), "
            f"{len(self.current)} already current, {len(self.problems)} failed"
        )


class _Interrupted(Exception):
    """The user stopped the run: uploads end at their next block."""


class _Dropped(Exception):
    """The connection or its SFTP channel died mid-transfer, perhaps leaving ``part``."""

    def __init__(self, reason: str, part: str | None = None) -> None:
        super().__init__(reason)
        self.part = part


def copy_step(
    run: Run, fleet: Fleet, envelopes: Mapping[str, PerHostEnvelope], built: Mapping[str, Path]
) -> Copies | None:
    """After the builds, before verification: upload to the ``copy`` hosts.

    ``built[host]`` is the file cargo produced for the host (what verification
    compares with). Any host's error stops publication, after every host finished.
    """
    workers = [w for w in copy_hosts(run.cluster, fleet.workers.values()) if w.host in envelopes]
    if not workers:
        return None
    digests = {source: file_sha256(source) for source in {built[w.host] for w in workers}}
    targets = [
        target_for(w, envelopes[w.host], built[w.host], digests[built[w.host]]) for w in workers
    ]
    copies = deliver(fleet, targets, run.settings, run.report)
    run.report(f"copy: {copies.summary()}")
    if copies.problems:
        raise FdlError(
            f"copy to {len(copies.problems)} host(s) failed; no envelope was published.\n"
            + "\n".join(f"  {p}" for p in copies.problems)
        )
    return copies


def deliver(
    fleet: Fleet, targets: Sequence[Target], settings: Settings, report: Callable[[str], None]
) -> Copies:
    """Query every copy host at once, then upload where the bytes are missing."""
    outcomes = fleet.run({t.host: query_script(t) for t in targets}, settings.probe_timeout)
    current: list[str] = []
    problems: list[str] = []
    todo: list[tuple[Target, HostState]] = []
    for target in targets:
        outcome = outcomes[target.host]
        if isinstance(outcome, Failure):
            problems.append(
                f"{target.host}: not reached ({outcome.reason}): the binary it holds cannot be "
                "brought up to date; bring the host back, or take it out of the cluster file"
            )
            continue
        state = parse_state(outcome.stdout)
        if state is None:
            problems.append(
                f"{target.host}: no usable answer to the copy query (exit {outcome.exited}): "
                + outcome.stderr.strip()[-200:]
            )
            continue
        decision = decide(target, state)
        if decision.action == "skip":
            current.append(target.host)
        elif decision.action == "error":
            problems.append(decision.message)
        else:
            todo.append((target, state))
    sent: dict[str, int] = {}
    if todo:
        size = megabytes(todo[0][0].size)
        report(
            f"copy: sending to {len(todo)} host(s) ({size} each), "
            f"{settings.copy_window or len(todo)} at a time; "
            f"{len(current)} already hold these bytes"
        )
        stop = threading.Event()
        window = min(settings.copy_window or len(todo), len(todo))
        with ThreadPoolExecutor(window) as pool:
            jobs = [pool.submit(_send, fleet, t, s, settings, report, stop) for t, s in todo]
            try:
                while not all(job.done() for job in jobs):  # a bare result() defers Ctrl-C
                    wait(jobs, timeout=0.1)
                for (target, _), job in zip(todo, jobs, strict=True):
                    problem = job.result()
                    if problem:
                        problems.append(problem)
                    else:
                        sent[target.host] = target.size
            except KeyboardInterrupt:
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise Stopped(
                    "copy stopped; temporary files removed where the host was reachable"
                ) from None
    return Copies(sent=sent, current=tuple(current), problems=tuple(problems))


def _send(
    fleet: Fleet,
    target: Target,
    state: HostState,
    settings: Settings,
    report: Callable[[str], None],
    stop: threading.Event,
) -> str | None:
    """Upload once, and once more on a fresh connection if this one dropped; the error."""
    started = time.monotonic()
    stale: list[str] = []  # a part the dropped connection could not remove
    for attempt in (1, 2):
        try:
            _upload(fleet, target, settings.probe_timeout, stop, stale)
            break
        except _Interrupted:
            return f"{target.host}: stopped"
        except _Dropped as exc:
            reason = str(exc)
            stale += [exc.part] if exc.part else []
            if attempt == 2:
                return f"{target.host}: upload failed twice, the connection dropped ({reason})"
            report(f"copy: {target.host}: connection dropped mid-upload ({reason}); retrying once")
            fleet.connections[target.host].close()
            failed = fleet.open([target.host])
            if failed:
                return (
                    f"{target.host}: the connection dropped mid-upload and could not be "
                    f"opened again: {failed[target.host].reason}"
                )
        except OSError as exc:
            return _write_error(target, state, exc)
    seconds = time.monotonic() - started
    report(f"copy: {target.host}: sent {megabytes(target.size)} in {seconds:.1f} s")
    return None


def _write_error(target: Target, state: HostState, exc: OSError) -> str:
    """A permission problem said as such; any other (SFTP reports a full disk met
    mid-write as a bare "Failure") with the bytes needed and the space there was."""
    if isinstance(exc, PermissionError):
        return f"{target.host}: {target.directory} is not writable by the ssh user: {exc}"
    free = "" if state.free_bytes is None else f", {megabytes(state.free_bytes)} free before"
    return (
        f"{target.host}: writing {target.final} failed ({exc}); the binary needs "
        f"{target.size} bytes ({megabytes(target.size)}){free}"
    )


def _upload(
    fleet: Fleet, target: Target, timeout: float, stop: threading.Event, stale: Sequence[str]
) -> None:
    """The temporary file written, made executable, checked for size, renamed into place;
    first, the ``stale`` parts of an attempt whose connection dropped are removed."""
    connection = fleet.connections[target.host]
    try:
        if not connection.is_connected:
            connection.open()
        sftp = connection.client.open_sftp()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise _Dropped(str(exc) or type(exc).__name__) from exc
    sftp.get_channel().settimeout(timeout)
    part = target.part(secrets.token_hex(6))
    try:
        for leftover in stale:
            _remove_quietly(sftp, leftover)
        with target.source.open("rb") as source, sftp.open(part, "wb") as remote:
            remote.set_pipelined(True)
            for block in iter(lambda: source.read(BLOCK), b""):
                if stop.is_set():
                    raise _Interrupted
                remote.write(block)
        written = sftp.stat(part).st_size
        if written != target.size:
            raise OSError(f"{part} holds {written} bytes, {target.size} were sent")
        sftp.chmod(part, 0o755)
        sftp.posix_rename(part, target.final)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        channel = sftp.get_channel()
        transport = connection.client.get_transport()
        dead = channel is None or channel.closed or transport is None or not transport.is_active()
        _remove_quietly(sftp, part)
        if dead or not isinstance(exc, OSError):
            raise _Dropped(str(exc) or type(exc).__name__, part) from exc
        raise
    except BaseException:
        _remove_quietly(sftp, part)
        raise
    finally:
        with contextlib.suppress(Exception):  # a dead connection cannot say goodbye
            sftp.close()


def _remove_quietly(sftp: paramiko.SFTPClient, part: str) -> None:
    """Best effort: on a dead connection the next query removes the part instead."""
    with contextlib.suppress(Exception):  # the original failure is the one to report
        sftp.remove(part)
