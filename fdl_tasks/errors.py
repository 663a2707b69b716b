"""The exception types a run raises to the task boundary."""


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
