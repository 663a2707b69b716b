"""The one exception type a user ever sees from fdl-tasks."""


class FdlError(Exception):
    """A problem the user can act on: bad input, a missing tool, a failed host.

    Tasks turn it into one readable paragraph on stderr and a non-zero exit,
    never a traceback.
    """
