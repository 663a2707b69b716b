"""An ssh failure sorted into its kind and said with its fix: no I/O here.

A host that is down (connection refused, timed out, no route, hung) is not a
configuration mistake (a key the host refuses, an identity file that is not a
private key, a port where no SSH server answers): the first is a warning, the
others are errors by default (:mod:`fdl_tasks.preflight.login_verdicts`). A configuration
failure names the user and the keys offered, and gives an ``ssh`` line to try
by hand, every word quoted.
"""

from __future__ import annotations

import shlex
import socket

import attrs
import paramiko
from invoke.exceptions import CommandTimedOut

from fdl_tasks.ssh.hostkey_policy import HostKeyRefused
from fdl_tasks.ssh.outcomes import Failure, FailureKind

#: paramiko's words for a peer that answered, but not as SSH speaks.
_NOT_SSH_WORDS = (
    "Indecipherable protocol version",
    "Invalid SSH banner",
    "Expecting packet",
    "Incompatible version",
)
_BANNER = "Error reading SSH protocol banner"


@attrs.frozen
class Login:
    """How the Fleet tried to log in to one host: who, where, with which keys."""

    user: str
    host: str
    port: int
    #: Key files offered, in order (the identity file first).
    keys: tuple[str, ...] = ()
    #: The ssh agent's keys were offered too.
    agent: bool = False
    #: Only the worker's ``ssh.identity_file`` was offered (no agent, no ~/.ssh/id_*).
    identity_only: bool = False
    #: What the port said to an SSH greeting, once the handshake failed ("" if nothing).
    answer: str = ""
    #: How the connection gets there: ``-J`` hops, or ``-o ProxyCommand=…`` (as ssh's argv).
    via: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def by_hand(self) -> str:
        """The ``ssh`` line that tries the same login by hand."""
        argv = ["ssh"]
        if self.keys:
            argv += ["-i", self.keys[0]]
        if self.identity_only:
            argv += ["-o", "IdentitiesOnly=yes"]
        argv += [*self.via, "-p", str(self.port), f"{self.user}@{self.host}", "true"]
        return " ".join(shlex.quote(word) for word in argv)

    def offered(self) -> str:
        keys = [*self.keys, *(["the ssh agent's keys"] if self.agent else [])]
        return ", ".join(keys) if keys else "none"


def _banner_failure(exc: BaseException) -> bool:
    return isinstance(exc, paramiko.SSHException) and _BANNER in str(exc)


def classify(exc: BaseException, answer: str = "") -> FailureKind:
    """The kind of a connection's or command's exception (``answer``: what the port
    said to an SSH greeting after the handshake failed, "" if nothing)."""
    if isinstance(exc, HostKeyRefused | paramiko.BadHostKeyException):
        return FailureKind.HOST_KEY
    if isinstance(exc, paramiko.PasswordRequiredException):
        return FailureKind.KEY_FILE
    if isinstance(exc, paramiko.AuthenticationException):
        return FailureKind.AUTH
    if isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc):
        return FailureKind.AUTH
    if isinstance(exc, CommandTimedOut | socket.gaierror | ConnectionError | TimeoutError):
        return FailureKind.UNREACHABLE
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return FailureKind.UNREACHABLE
    if _banner_failure(exc):  # a hung host (accepted, then silent) is unreachable;
        # closed without a banner: not SSH if the port says something else when greeted.
        not_ssh = wants_greeting(exc) and answer and not answer.startswith("SSH-")
        return FailureKind.NOT_SSH if not_ssh else FailureKind.UNREACHABLE
    if isinstance(exc, paramiko.SSHException) and any(w in str(exc) for w in _NOT_SSH_WORDS):
        return FailureKind.NOT_SSH
    if isinstance(exc, paramiko.SSHException) and "No existing session" in str(exc):
        return FailureKind.UNREACHABLE
    return FailureKind.OTHER


def describe_failure(exc: BaseException, login: Login, connect_timeout: float) -> Failure:
    """One readable line for anything a connection or command can raise, with its kind.

    ``connect_timeout`` is the host's own budget for connect, banner and auth.
    """
    kind = classify(exc, login.answer)
    where = login.where
    if isinstance(exc, HostKeyRefused):
        return Failure(exc.reason, kind)
    if kind is FailureKind.HOST_KEY:
        return Failure(
            f"host key of {where} does not match the one remembered: it may be a man in "
            "the middle; if the host was reinstalled, remove the old key with ssh-keygen -R",
            kind,
        )
    if kind in (FailureKind.AUTH, FailureKind.KEY_FILE, FailureKind.NOT_SSH):
        return Failure(f"{_config_problem(exc, kind, login)}; try by hand: {login.by_hand()}", kind)
    if isinstance(exc, CommandTimedOut):
        return Failure(f"no answer within {exc.timeout:g}s (command timed out)", kind)
    if isinstance(exc, socket.gaierror):
        return Failure(f"cannot resolve {login.host}", kind)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | ConnectionError):
        return Failure(f"connection refused at {where}", kind)
    if isinstance(exc, TimeoutError):
        return Failure(f"connection to {where} timed out after {connect_timeout:g}s", kind)
    if wants_greeting(exc):
        return Failure(
            f"{where} accepted the connection but closed it before any SSH banner "
            "(sshd refusing connections: MaxStartups, tcp wrappers?)",
            kind,
        )
    if kind is FailureKind.UNREACHABLE:
        return Failure(
            f"{where} accepted the connection but no SSH session was established "
            f"within {connect_timeout:g}s (no SSH banner: hung host?)",
            kind,
        )
    return Failure(f"{type(exc).__name__} at {where}: {exc}".strip(), kind)


def _config_problem(exc: BaseException, kind: FailureKind, login: Login) -> str:
    """What the configuration mistake is, before the line to try by hand."""
    where, user = login.where, login.user
    if kind is FailureKind.NOT_SSH:
        said = f"it said {login.answer[:60]!r}" if login.answer else str(exc)
        return (
            f"{where} answers, but not as an SSH server ({said}): check that {login.port} "
            "is its sshd's port (ssh.port, or Port in an ssh_config)"
        )
    if kind is FailureKind.KEY_FILE:
        key = login.keys[0] if login.keys else "the identity file"
        return (
            f"{key} needs a passphrase and no ssh agent holds it: ssh-add it, or use a "
            "key without one"
        )
    if isinstance(exc, paramiko.BadAuthenticationType):
        allowed = ", ".join(exc.allowed_types) or "none"
        return (
            f"{where} does not accept keys for user {user} (it allows: {allowed}); "
            "fdl-tasks logs in with keys only"
        )
    if not login.keys and not login.agent:
        return (
            f"no key to log in to {where} as {user}: no ssh.identity_file, no ssh agent "
            "and no ~/.ssh/id_* key; set ssh.identity_file"
        )
    return (
        f"authentication refused at {where} for user {user} (keys offered: "
        f"{login.offered()}): check the user, and that the key's public half is in "
        f"~{user}/.ssh/authorized_keys there"
    )


def key_file_failure(login: Login, why: str) -> Failure:
    """The identity file cannot be used (``why``: ``missing``, ``public`` or ``unreadable``)."""
    key = login.keys[0] if login.keys else "the identity file"
    purpose = f"to log in to {login.where} as {login.user}"
    # The line logs in as fdl-tasks will once the file is right: with that key alone.
    hand = attrs.evolve(login, keys=login.keys[:1], identity_only=bool(login.keys)).by_hand()
    if why == "public":
        private = key.removesuffix(".pub")
        text = (
            f"ssh.identity_file {key} is a public key: point it at the private key "
            f"({private}, if that is its pair), {purpose}"
        )
        hand = attrs.evolve(login, keys=(private,), identity_only=True).by_hand()
    elif why == "missing":
        text = f"ssh.identity_file {key} does not exist ({purpose})"
    else:
        text = f"ssh.identity_file {key} is not a private key fdl-tasks can read ({purpose})"
    return Failure(f"{text}; try by hand: {hand}", FailureKind.KEY_FILE)


def wants_greeting(exc: BaseException) -> bool:
    """A handshake closed before any banner: what the port says to a greeting tells a
    service that is not SSH from an sshd refusing connections."""
    return _banner_failure(exc) and not isinstance(exc.__context__, TimeoutError)
