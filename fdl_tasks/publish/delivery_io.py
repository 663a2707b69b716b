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

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import attrs

from fdl_tasks.config.run import Run
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.errors import FdlError, Stopped
from fdl_tasks.publish.delivery import (
    HostState,
    Target,
    copy_hosts,
    decide,
    megabytes,
    parse_state,
    query_script,
    target_for,
    write_failed,
)
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.uploads import Dropped, Interrupted, NoSftp, stream, upload
from fdl_tasks.ssh.outcomes import Failure
from fdl_tasks.ssh.remote import Fleet


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


def copy_step(
    run: Run,
    fleet: Fleet,
    envelopes: Mapping[str, PerHostEnvelope],
    built: Mapping[str, Path],
    digests: Mapping[Path, str],
) -> Copies | None:
    """After the builds, before verification: upload to the ``copy`` hosts.

    ``built[host]`` is the file cargo produced for the host (what verification
    compares with), ``digests`` each one's sha256 as its build step read it. Any
    host's error stops publication, after every host finished.
    """
    workers = [w for w in copy_hosts(run.cluster, fleet.workers.values()) if w.host in envelopes]
    if not workers:
        return None
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
                    if problem := job.result():
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
                    upload(fleet, target, settings.probe_timeout, stop, stale)
                    break
                except NoSftp:
                    exec_channel = True
            if problem := stream(fleet, target, state, settings.probe_timeout, stop, stale):
                return problem
            break
        except Interrupted:
            return f"{target.host}: stopped"
        except Dropped as exc:
            reason = str(exc)
            stale += [exc.part] if exc.part else []
            if attempt == 2:
                return f"{target.host}: upload failed twice, the connection dropped ({reason})"
            report(f"copy: {target.host}: connection dropped mid-upload ({reason}); retrying once")
            fleet.connections[target.host].close()
            if failed := fleet.open([target.host]):
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
