"""``inv push-libtorch``: put each copy host's libtorch variant at ``<path>/libtorch/<arch>``.

Only changed files move (:mod:`fdl_tasks.publish.libtorch_push`); each is written to a
temporary name and renamed, with the controller's mode and modification
time, so an interrupted push leaves whole files behind and the next one
resumes. Hosts run ``fdl.copy_window`` at a time, each reporting progress.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko

from fdl_tasks.config.model import Worker
from fdl_tasks.config.run import Run
from fdl_tasks.config.variants import libtorch_dir, require_arch
from fdl_tasks.core.errors import FdlError
from fdl_tasks.publish.delivery import PART_INFIX, megabytes
from fdl_tasks.publish.libtorch_push import SizeAndTime, changed, listing_script, parse_listing
from fdl_tasks.ssh.outcomes import Failure
from fdl_tasks.ssh.remote import Fleet

#: Progress is reported each time this many more bytes reached a host.
PROGRESS_BYTES = 256 << 20


def local_files(directory: Path) -> dict[str, SizeAndTime]:
    """The controller's files of a variant (links followed), as the host would list them."""
    found: dict[str, SizeAndTime] = {}
    for parent, _, files in os.walk(directory, followlinks=True):
        for name in files:
            path = Path(parent) / name
            info = path.stat()
            found[path.relative_to(directory).as_posix()] = (info.st_size, int(info.st_mtime))
    return found


def push_libtorch(run: Run, workers: list[Worker]) -> None:
    """Every given copy host's variant completed; an error names each host that failed."""
    if not workers:
        raise FdlError("no copy host to push to: push-libtorch is for workers with delivery: copy")
    sources = {w.host: Path(libtorch_dir(str(run.root), require_arch(w))) for w in workers}
    for host, source in sources.items():
        if not (source / "lib").is_dir():
            raise FdlError(f"{host}: the controller has no variant at {source}/lib to push")
    with Fleet(workers, run.settings, run.report) as fleet:
        remote_dirs = {w.host: libtorch_dir(w.path, require_arch(w)) for w in workers}
        listings = fleet.run(
            {h: listing_script(d) for h, d in remote_dirs.items()}, run.settings.probe_timeout
        )
        window = min(run.settings.copy_window or len(workers), len(workers))
        with ThreadPoolExecutor(window) as pool:
            jobs = {
                w.host: pool.submit(
                    _push_host,
                    fleet,
                    w.host,
                    sources[w.host],
                    remote_dirs[w.host],
                    listings[w.host],
                    run.report,
                )
                for w in workers
            }
            problems = [p for job in jobs.values() if (p := job.result())]
    if problems:
        raise FdlError(
            f"push-libtorch failed on {len(problems)} host(s); run it again to resume:\n"
            + "\n".join(f"  {p}" for p in problems)
        )


def _push_host(
    fleet: Fleet,
    host: str,
    source: Path,
    remote: str,
    listing: object,
    report: Callable[[str], None],
) -> str | None:
    if isinstance(listing, Failure):
        return f"{host}: not reached: {listing.reason}"
    if (found := parse_listing(getattr(listing, "stdout", ""))) is None:
        return f"{host}: no usable answer listing {remote}"
    try:
        local = local_files(source)
    except OSError as exc:  # a dangling link, an unreadable file: name it, push nothing
        return f"{host}: cannot read the controller's variant ({exc}); nothing was sent"
    todo = changed(local, found)
    total = sum(local[p][0] for p in todo)
    report(
        f"push-libtorch: {host}: {len(todo)} of {len(local)} file(s) to send "
        f"({megabytes(total)}) to {remote}"
    )
    done, shown = 0, 0
    try:
        sftp = fleet.connections[host].client.open_sftp()
        sftp.get_channel().settimeout(fleet.settings.probe_timeout)
        made: set[str] = set()
        for relative in todo:
            final = posixpath.join(remote, relative)
            _make_dirs(sftp, posixpath.dirname(final), made)
            _put(sftp, source / relative, final)
            done += local[relative][0]
            if done - shown >= PROGRESS_BYTES:
                shown = done
                report(f"push-libtorch: {host}: {megabytes(done)} of {megabytes(total)}")
        sftp.close()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        return f"{host}: stopped after {megabytes(done)} of {megabytes(total)}: {exc}"
    report(f"push-libtorch: {host}: done, {megabytes(total)} sent")
    return None


def _make_dirs(sftp: paramiko.SFTPClient, directory: str, made: set[str]) -> None:
    """``mkdir -p`` over SFTP, each directory asked about once."""
    if directory in made or directory in ("", "/"):
        return
    _make_dirs(sftp, posixpath.dirname(directory), made)
    try:
        sftp.stat(directory)
    except FileNotFoundError:
        sftp.mkdir(directory)
    made.add(directory)


def _put(sftp: paramiko.SFTPClient, source: Path, final: str) -> None:
    """One file to a temporary name beside ``final``, with its mode and time, renamed."""
    info = source.stat()
    name = posixpath.basename(final)
    part = posixpath.join(posixpath.dirname(final), f".{name}{PART_INFIX}{secrets.token_hex(6)}")
    try:
        with source.open("rb") as stream:
            sftp.putfo(stream, part, file_size=info.st_size, confirm=True)
        sftp.chmod(part, info.st_mode & 0o7777)
        sftp.utime(part, (info.st_atime, info.st_mtime))
        sftp.posix_rename(part, final)
    except BaseException:
        with contextlib.suppress(Exception):
            sftp.remove(part)
        raise
