"""What OpenSSH's host-key options decide, and the one-line messages that say so: no I/O here.

A refused key is a :class:`HostKeyRefused` whose reason names the host, the
file that decided and how to fix it; lines or files that cannot be used, and
hosts that turned checking off, are named in warnings rather than ignored
silently. :mod:`fdl_tasks.ssh.known_hosts_io` carries these decisions out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

import paramiko

from fdl_tasks.core.console import listed
from fdl_tasks.ssh.known_hosts import split_name

#: ``StrictHostKeyChecking`` values and what they come to here. ``ask`` is
#: ``yes``: there is no one to ask in a fan-out (as under ``ssh -o BatchMode=yes``).
#: ``no``/``off`` are ``accept-new``: a changed key is refused in every mode.
STRICT_WORDS = {
    "yes": "yes",
    "true": "yes",
    "ask": "yes",
    "accept-new": "accept-new",
    "no": "accept-new",
    "false": "accept-new",
    "off": "accept-new",
}
#: With no ``StrictHostKeyChecking`` anywhere: trust on first use.
DEFAULT_STRICT = "accept-new"


class HostKeyRefused(paramiko.SSHException):
    """A host key refused as OpenSSH would refuse it; :attr:`reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def unstrict(said: str) -> bool:
    """Whether ``StrictHostKeyChecking`` as spelt asks for no checking (warned: accept-new)."""
    return said.lower() in ("no", "off", "false")


def _named(path: Path | None) -> str:
    return str(path) if path else "memory"


def keyscan_hint(hostname: str, key: paramiko.PKey, path: Path | None) -> str:
    """How to add that host's key by hand (to ``path``): an ``ssh-keyscan`` line."""
    host, port = split_name(hostname)
    port_option = "" if port == 22 else f"-p {port} "
    target = f" >> {path}" if path else ""
    return f"ssh-keyscan {port_option}-t {key.get_name()} {host}{target}"


def revoked_refusal(where: str, key: paramiko.PKey, path: Path | None) -> HostKeyRefused:
    """A key an ``@revoked`` line in ``path`` lists: refused in every mode."""
    return HostKeyRefused(
        f"host key of {where} ({key.get_name()} {key.fingerprint}) is marked @revoked "
        f"in {_named(path)}: refused"
    )


def unknown_refusal(
    hostname: str, key: paramiko.PKey, said: str, path: Path | None
) -> HostKeyRefused:
    """A new key where ``StrictHostKeyChecking`` is ``said`` (a yes); how to add it to ``path``."""
    host, port = split_name(hostname)
    treated = "" if said == "yes" else " (no one to ask: treated as yes)"
    return HostKeyRefused(
        f"host key of {host}:{port} ({key.get_name()} {key.fingerprint}) is not known "
        f"and StrictHostKeyChecking is {said}{treated}: check that fingerprint "
        "with the host's administrator, then add the key, e.g. " + keyscan_hint(hostname, key, path)
    )


def changed_refusal(where: str, hostname: str, path: Path | None, managed: bool) -> HostKeyRefused:
    """A key other than the one ``path`` remembers: it may be a man in the middle.

    ``managed``: ``path`` is not the user's own file, so the fix is its manager's.
    """
    if managed:
        fix = f"if the host was reinstalled, whoever manages {path} must update it"
    else:
        fix = "if the host was reinstalled, remove the old key with ssh-keygen -R "
        fix += shlex.quote(hostname)
        fix += f" -f {shlex.quote(str(path))}" if path else ""
    return HostKeyRefused(
        f"host key of {where} does not match the one remembered in {_named(path)}: "
        f"it may be a man in the middle; {fix}"
    )


def file_warnings(
    path: Path | None, unreadable: str, skipped: Iterable[tuple[int, str]]
) -> list[str]:
    """A file that cannot be read, and one warning per reason naming the lines it skips."""
    warnings = []
    if unreadable:
        warnings.append(f"warning: {path} cannot be read ({unreadable}); ignored")
    reasons: dict[str, list[int]] = {}
    for number, why in skipped:
        reasons.setdefault(why, []).append(number)
    for why, numbers in reasons.items():
        warnings.append(
            f"warning: {path} line{'s' if len(numbers) > 1 else ''} {listed(numbers)}: {why}; "
            "ignored, so a host only such a line vouches for counts as unknown"
        )
    return warnings


def unstrict_warning(hosts: Sequence[str]) -> str:
    """What ``StrictHostKeyChecking no`` comes to for these hosts."""
    return (
        f"warning: StrictHostKeyChecking no for {listed(hosts)}: treated as accept-new, so a "
        "new host key is accepted unverified and remembered, but a changed one is "
        "still refused (it may be a man in the middle)"
    )


def _key_type(name: str) -> str:
    """``ssh-ed25519`` → ``ED25519``, ``ecdsa-sha2-nistp256`` → ``ECDSA``, as OpenSSH says them."""
    return name.removeprefix("ssh-").split("-")[0].upper()


def added_lines(added: Sequence[tuple[str, str, Path | None]]) -> list[str]:
    """What accept-new remembered, one line per file: the names as known_hosts writes them
    (``[host]:port``) and each key's type, as OpenSSH's "Permanently added" says. Not a
    "warning:": a first contact is how a healthy cluster starts."""
    by_file: dict[Path | None, list[str]] = {}
    for name, keytype, path in added:
        by_file.setdefault(path, []).append(f"'{name}' ({_key_type(keytype)})")
    return [
        f"permanently added {listed(names)} to the list of known hosts "
        f"({path if path else 'in memory: no user known_hosts file'}; StrictHostKeyChecking "
        "accept-new)"
        for path, names in by_file.items()
    ]
