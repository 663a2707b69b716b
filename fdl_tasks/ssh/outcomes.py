"""What a command sent to one host came to: a reply, or a failure said in one line."""

from __future__ import annotations

import enum

import attrs


class FailureKind(enum.Enum):
    """What kind of failure a host's was: the host down, or a configuration mistake.

    The value is what ``--json`` writes (a verdict's ``failure``).
    """

    #: Connection refused, timed out, no route, no name, hung, no answer in time.
    UNREACHABLE = "unreachable"
    #: The host's key was refused: changed, ``@revoked``, or unknown where
    #: ``StrictHostKeyChecking`` is ``yes``. Always an error.
    HOST_KEY = "host_key"
    #: The host refused every key offered, or there was none to offer.
    AUTH = "auth"
    #: The identity file is not a private key that can be used.
    KEY_FILE = "key_file"
    #: The port answers, but not as an SSH server.
    NOT_SSH = "not_ssh"
    #: Not asked: the host's gateway (``fdl.gateways``) could not be reached, or was lost
    #: while the command ran. Says nothing of the host itself; a warning like unreachable.
    GATEWAY = "gateway"
    #: Anything else: reported as it came, a warning like unreachable.
    OTHER = "other"


#: The kinds that are configuration mistakes (``fdl.ssh_login_errors`` decides).
CONFIG_KINDS = frozenset({FailureKind.AUTH, FailureKind.KEY_FILE, FailureKind.NOT_SSH})


@attrs.frozen
class Reply:
    """A command that ran; its exit code may still be non-zero."""

    stdout: str
    stderr: str
    exited: int


@attrs.frozen
class Failure:
    """A command that never ran to the end on that host, why in one line, and its kind."""

    reason: str
    kind: FailureKind = FailureKind.UNREACHABLE


Outcome = Reply | Failure
