"""``push-libtorch``, pure part: what a copy host's libtorch variant lacks.

A variant is several GB of files that rarely change: a file moves only when
the host has no file of that path, or one of another size or modification
time (whole seconds; the upload sets the controller's time on the host's
copy, so a finished file is never sent again and an interrupted push
resumes where it stopped). Files the host has and the controller does not
are left alone: removing a variant is the user's call.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from fdl_tasks.ssh.answers import BEGIN, END, marked_answers

#: A file's size in bytes and its modification time in whole seconds: which version it is.
SizeAndTime = tuple[int, int]


def listing_script(directory: str) -> str:
    """Every regular file under ``directory``: ``f=<size> <mtime> <relative path>``."""
    where = shlex.quote(directory)
    return "\n".join(
        [
            f"echo {BEGIN}",
            f"[ -d {where} ] && find {where} -type f -printf 'f=%s %T@ %P\\n' 2>/dev/null",
            f"echo {END}",
            "exit 0",
        ]
    )


def parse_listing(stdout: str) -> dict[str, SizeAndTime] | None:
    answers = marked_answers(stdout)
    if answers is None:
        return None
    found: dict[str, SizeAndTime] = {}
    for line in answers.every("f"):
        size, mtime, path = [*line.split(" ", 2), "", ""][:3]
        if size.isdigit() and path:
            found[path] = (int(size), int(float(mtime or 0)))
    return found


def changed(local: Mapping[str, SizeAndTime], remote: Mapping[str, SizeAndTime]) -> list[str]:
    """The controller's files the host lacks or holds in another version, in order."""
    return sorted(path for path, version in local.items() if remote.get(path) != version)
