"""Files on the shared mount: atomic replacement, log tails."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from fdl_tasks.core.errors import FdlError


def replace_atomically(path: Path, fill: Callable[[Path], object]) -> None:
    """``fill`` writes a hidden partial file beside ``path``, which then replaces it:
    readers see the old file or the new one, never a half-written one. A partial
    file that could not be finished (a full disk) is removed, not left beside it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fill(partial)
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise FdlError(f"cannot write {path}: {exc}") from None


def remove_partials(path: Path) -> None:
    """Remove the partial files of ``path`` that a killed run left (call under the project
    lock, when no other run can be writing one)."""
    with contextlib.suppress(OSError):
        for partial in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
            partial.unlink(missing_ok=True)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically."""
    replace_atomically(path, lambda partial: partial.write_text(text, encoding="utf-8"))


#: A second in nanoseconds: a file system whose times are whole seconds keeps these.
SECOND_NS = 1_000_000_000


def copy_atomically(source: Path, destination: Path) -> bool:
    """Replace ``destination`` with a copy of ``source`` (mode and times kept), atomically;
    ``False`` when it already is one (same size and modification time, as ``copy2`` leaves).

    A time in whole seconds proves nothing: on such a mount (SSHFS: SFTP v3 carries
    seconds) a binary relinked in the second of the last copy, at the same size, would
    keep the old build's copy. Such a file is copied again."""
    try:
        want, have = source.stat(), destination.stat()
        same = (want.st_size, want.st_mtime_ns) == (have.st_size, have.st_mtime_ns)
        if same and want.st_mtime_ns % SECOND_NS:
            return False
    except FileNotFoundError:
        pass
    replace_atomically(destination, lambda partial: shutil.copy2(source, partial))
    return True


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log ('' if it cannot be read): what a failure shows."""
    return "\n".join(text_or_empty(path).splitlines()[-lines:])


def text_or_empty(path: Path | str) -> str:
    """A file's text (undecodable bytes replaced), empty when it cannot be read: for the
    files a tool's own earlier run wrote, whose absence only means "nothing known"."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
