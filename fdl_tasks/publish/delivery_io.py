"""Copy delivery over the Fleet's own connections: one query round trip, SFTP uploads.

Each upload writes a temporary name beside the final path and renames it
(``posix-rename@openssh.com``, an atomic ``rename(2)`` on the host): a binary
running there keeps its inode, and nothing can exec half a file. A host whose
sshd refuses the SFTP subsystem (hardened images drop it) gets the same file,
checks and rename over the ssh exec channel instead. A dropped connection is
retried once on a fresh one; every other failure is that host's error, and the
other hosts still finish.
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
import fabric
import paramiko

from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.binary_files import file_sha256
from fdl_tasks.core.errors import FdlError, Stopped
from fdl_tasks.publish.delivery import (
    HostState,
    Target,
    copy_hosts,
    decide,
    megabytes,
    parse_state,
    query_script,
    refused_both,
    stream_problem,
    stream_script,
    target_for,
    write_failed,
)
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.ssh.outcomes import Failure
from fdl_tasks.ssh.remote import Fleet

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


class _NoSftp(Exception):
    """The host refused the SFTP subsystem on a live connection: nothing was written."""


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
    """Upload once, and once more on a fresh connection if this one dropped; the error.

    A host that refuses SFTP is sent to over the exec channel, and said so once.
    """
    started = time.monotonic()
    stale: list[str] = []  # a part the dropped connection could not remove
    exec_channel = False  # the host refused SFTP
    for attempt in (1, 2):
        try:
            if not exec_channel:
                try:
                    _upload(fleet, target, settings.probe_timeout, stop, stale)
                    break
                except _NoSftp:
                    exec_channel = True
            problem = _stream(fleet, target, state, settings.probe_timeout, stop, stale)
            if problem:
                return problem
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
    how = " over the ssh exec channel: the host refuses SFTP" if exec_channel else ""
    report(f"copy: {target.host}: sent {megabytes(target.size)} in {seconds:.1f} s{how}")
    return None


def _write_error(target: Target, state: HostState, exc: OSError) -> str:
    """A permission problem said as such; any other (SFTP reports a full disk met
    mid-write as a bare "Failure") with the bytes needed and the space there was."""
    if isinstance(exc, PermissionError):
        return f"{target.host}: {target.directory} is not writable by the ssh user: {exc}"
    return write_failed(target, state, str(exc))


def _transport(connection: fabric.Connection) -> paramiko.Transport:
    """The host's live transport, opened again if it was closed."""
    try:
        if not connection.is_connected:
            connection.open()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise _Dropped(_why(exc)) from exc
    transport: paramiko.Transport | None = connection.client.get_transport()
    if transport is None or not transport.is_active():
        raise _Dropped("the connection is closed")
    return transport


def _open_sftp(transport: paramiko.Transport, timeout: float) -> paramiko.SFTPClient:
    """An SFTP session; :class:`_NoSftp` if the host refuses the subsystem or no SFTP
    server answers on it while the connection stays up (paramiko says "Channel closed.")."""
    try:
        channel = transport.open_session()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise _Dropped(_why(exc)) from exc
    channel.settimeout(timeout)
    try:
        channel.invoke_subsystem("sftp")
        return paramiko.SFTPClient(channel)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        channel.close()
        if transport.is_active():
            raise _NoSftp from exc
        raise _Dropped(_why(exc)) from exc


def _upload(
    fleet: Fleet, target: Target, timeout: float, stop: threading.Event, stale: Sequence[str]
) -> None:
    """The temporary file written, made executable, checked for size, renamed into place;
    first, the ``stale`` parts of an attempt whose connection dropped are removed."""
    connection = fleet.connections[target.host]
    sftp = _open_sftp(_transport(connection), timeout)
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
            raise _Dropped(_why(exc), part) from exc
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


def _stream(
    fleet: Fleet,
    target: Target,
    state: HostState,
    timeout: float,
    stop: threading.Event,
    stale: Sequence[str],
) -> str | None:
    """The file on the stdin of :func:`stream_script` over an exec channel; the error.

    A stop or a dropped connection leaves the host a short file, which its checks
    remove; a stop waits for that before it raises.
    """
    transport = _transport(fleet.connections[target.host])
    part = target.part(secrets.token_hex(6))
    try:
        channel = transport.open_session(timeout=timeout)
        channel.exec_command(stream_script(target, part, stale))
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if not transport.is_active():
            raise _Dropped(_why(exc)) from exc
        return refused_both(target.host, _why(exc))
    try:
        return _feed(channel, target, state, timeout, stop, part)
    finally:
        channel.close()


def _feed(
    channel: paramiko.Channel,
    target: Target,
    state: HostState,
    timeout: float,
    stop: threading.Event,
    part: str,
) -> str | None:
    """The file's blocks, then end of input; the script's answer as the error, if any."""
    channel.settimeout(timeout)
    try:
        with target.source.open("rb") as source:
            for block in iter(lambda: source.read(BLOCK), b""):
                if stop.is_set():
                    channel.shutdown_write()
                    _exited(channel, timeout)
                    raise _Interrupted
                channel.sendall(block)
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if not channel.exit_status_ready():  # else the script ended early: its answer
            raise _Dropped(_why(exc), part) from exc
    exited = _exited(channel, timeout)
    if exited is None:
        raise _Dropped(f"no answer within {timeout:.0f} s after the last byte", part)
    out, err = _drain(channel.recv), _drain(channel.recv_stderr)
    return stream_problem(target, state, exited, out, err)


def _exited(channel: paramiko.Channel, timeout: float) -> int | None:
    """The script's exit status; ``None`` if the connection died or it did not end in time."""
    if not channel.status_event.wait(timeout):
        return None
    status = channel.recv_exit_status()
    return None if status == -1 else status


def _drain(read: Callable[[int], bytes]) -> str:
    """What the channel holds of one stream (small: the script's answer)."""
    return b"".join(iter(lambda: read(BLOCK), b"")).decode(errors="replace")


def _why(exc: BaseException) -> str:
    """paramiko's own words: a refused channel's text, else the message, else the type."""
    text = exc.text if isinstance(exc, paramiko.ChannelException) else str(exc)
    return text or type(exc).__name__
