"""The exception types a run raises to the task boundary."""

from __future__ import annotations

from collections.abc import Callable


class FdlError(Exception):
    """A problem the user can act on: bad input, a missing tool, a failed host.

    Tasks turn it into one readable paragraph on stderr and a non-zero exit,
    never a traceback.
    """


class Stopped(Exception):
    """The user stopped the run (Ctrl-C, SIGTERM): every build was stopped, nothing published.

    Not an :class:`FdlError`: a watch loop must tell "the user stopped it" from
    "a build failed" (it keeps watching after a failure, never after a stop).
    Tasks turn it into one line and exit code 130.
    """


class LeftRunning(FdlError):
    """A failed run (a build timed out) left a container or process it could not remove.

    The run is not clean: tasks exit with code 3, not 1; the message names each
    one with the command that removes it.
    """


class StoppedLeftRunning(Stopped):
    """A stop that could not remove every container or process of the run.

    Still a stop (a watch ends), but not a clean one: tasks exit with code 3, not 130.
    """


class LoginRefused(FdlError):
    """A host's ssh login is misconfigured: a key it refuses, an identity file that is not a
    private key, a port where no SSH server answers. Tasks exit with code 4, not 1: this
    is not the host being down (a warning), and the launch would fail there too.
    """


class NothingVerified(FdlError):
    """Verification was asked for, there were hosts to ask, and not one could be asked
    (every one down): nothing was published. Tasks exit with code 5."""


class ProgramExited(Exception):
    """A program the task ran in the foreground (flodl's launcher) ended with ``code``: the
    task exits with the same code and adds nothing, the program having said why."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exited {code}")
        self.code = code


def passed(text: str, test: Callable[[str], object], error: Callable[[], Exception]) -> str:
    """``text`` when it passes ``test`` (a pattern's ``fullmatch``, say); else ``error()``,
    raised: the one shape of every "check, then say why" of a text."""
    if not test(text):
        raise error()
    return text
