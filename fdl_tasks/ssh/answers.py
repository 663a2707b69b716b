"""What every remote script answers in: ``key=value`` lines between two markers.

The probe, delivery verification and copy delivery each run one script per
host; a login banner or a chatty shell rc may print around it, so the answers
are read between the markers only. The host facts every script asks (CPU, libc)
are here too, read the same way everywhere.
"""

from __future__ import annotations

import re

import attrs

BEGIN, END = "--fdl-probe-begin--", "--fdl-probe-end--"


_GLIBC = re.compile(r"(?:glibc|gnu libc)[^\n]*?(\d+)\.(\d+)", re.IGNORECASE)


#: Shell lines answering the host's CPU architecture (``cpu_arch=``) and libc (``libc=``),
#: asked by the probe and by delivery verification alike. glibc names itself through
#: ``getconf`` (one small program); only another libc, or no getconf, costs ldd's banner
#: (ldd is a bash script: a shell and three programs per host, see docs/fleet.md).
HOST_FACT_LINES = (
    "printf 'cpu_arch=%s\\n' \"$(uname -m 2>/dev/null)\"",
    "l=$(getconf GNU_LIBC_VERSION 2>/dev/null); case $l in glibc*) ;; "
    "*) l=$(ldd --version 2>&1 | head -n 2 | tr '\\n' ' ') ;; esac; printf 'libc=%s\\n' \"$l\"",
)


def glibc_version(libc: str | None) -> tuple[int, int] | None:
    """``getconf``'s ``glibc X.Y`` or ``ldd --version``'s first lines → glibc's (major,
    minor); ``None`` for another libc."""
    match = _GLIBC.search(libc or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


@attrs.frozen
class Answers:
    """A host's ``key=value`` answers, in order (a key may come several times)."""

    pairs: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        """The first answer to ``key`` (``None`` if it never came)."""
        return next((value for k, value in self.pairs if k == key), None)

    def every(self, key: str) -> tuple[str, ...]:
        return tuple(value for k, value in self.pairs if k == key)


def marked_answers(stdout: str) -> Answers | None:
    """The ``key=value`` lines between the markers; ``None`` if a marker is missing.

    Whatever a login banner or a chatty shell rc prints around them is ignored.
    """
    if BEGIN not in stdout or END not in stdout:
        return None
    body = stdout.split(BEGIN, 1)[1].split(END, 1)[0]
    split = (line.partition("=") for line in body.splitlines())
    return Answers(tuple((key, value.strip()) for key, equals, value in split if equals))
