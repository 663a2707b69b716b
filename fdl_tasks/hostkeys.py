"""Host keys as OpenSSH checks them: known_hosts files read once, StrictHostKeyChecking honoured.

- :class:`KnownHosts` is one known_hosts file, parsed once per fan-out and shared
  by every connection that reads it. It understands what OpenSSH writes (plain
  names, ``[host]:port``, hashed ``|1|`` names, ``*``/``?``/``!`` patterns,
  ``@revoked``) and keeps the lines paramiko cannot use (``@cert-authority``, a
  key type it does not know) in :attr:`KnownHosts.skipped`, to be named in a
  warning rather than dropped silently.
- :class:`KnownHostsView` is what one connection consults: its user files,
  then its global ones, as OpenSSH reads ``UserKnownHostsFile`` and
  ``GlobalKnownHostsFile``. A revoked key is never offered as a trusted one.
- :class:`TrustOnFirstUse` is the policy for a key that no file knows:
  refused under ``StrictHostKeyChecking yes`` (the error names the host and how
  to add its key), else accepted and remembered in the first user file.

A key that no longer matches a remembered one is refused by paramiko itself,
in every mode (it may be a man in the middle); :func:`explain_refusal` says so
in one line naming the file that holds the old key.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import functools
import hmac
import os
import re
import shlex
import stat
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import paramiko
from paramiko.pkey import UnknownKeyType

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

_PORT_NAME = re.compile(r"\[(?P<host>.*)\]:(?P<port>[0-9]+)")


class HostKeyRefused(paramiko.SSHException):
    """A host key refused as OpenSSH would refuse it; :attr:`reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KnownLine(NamedTuple):
    """One usable known_hosts line: its names (or patterns), its key, where it is."""

    names: tuple[str, ...]
    key: paramiko.PKey
    number: int
    revoked: bool = False


def split_name(name: str) -> tuple[str, int]:
    """``[host]:2222`` → ``("host", 2222)``; ``host`` → ``("host", 22)``."""
    match = _PORT_NAME.fullmatch(name)
    return (match["host"], int(match["port"])) if match else (name, 22)


def _is_pattern(name: str) -> bool:
    return name.startswith("!") or "*" in name or "?" in name


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's ``match_pattern``: ``*`` and ``?`` only (``[`` is literal), any case."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


@functools.lru_cache(maxsize=65536)
def _unhash(hashed: str) -> tuple[bytes, bytes] | None:
    """``|1|salt|hmac`` → ``(salt, hmac)``, decoded once per line."""
    parts = hashed.split("|")
    if len(parts) != 4:
        return None
    try:
        return base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return None


def _name_matches(name: str, patterns: Iterable[str]) -> bool:
    """OpenSSH's ``match_hostname`` for a lower-case name: a pattern matches, no ``!pattern`` does.

    A hashed ``|1|`` name is the HMAC-SHA1 of the name keyed with its salt
    (``HashKnownHosts yes``).
    """
    found = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern[1:] if negated else pattern
        if bare.startswith("|1|"):
            salted = _unhash(bare)
            hit = salted is not None and hmac.compare_digest(
                hmac.digest(salted[0], name.encode(), "sha1"), salted[1]
            )
        elif "*" in bare or "?" in bare:
            hit = _glob(bare).fullmatch(name) is not None
        else:
            hit = bare.lower() == name
        if hit and negated:
            return False
        found = found or hit
    return found


class _KeyMap(dict[str, paramiko.PKey]):
    """What ``SSHClient.connect`` expects from a lookup: ``keys()`` is indexable."""

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())


class KnownHosts(paramiko.HostKeys):
    """One ``known_hosts`` file, parsed once per fan-out and shared by every connection.

    ``paramiko.HostKeys.load`` checks each new line against all earlier ones
    (quadratic in the file's length) and ``lookup`` scans every entry; loading
    the file for each of N connections cost about 80 ms of controller CPU per
    host at 512 hosts. This loads in one pass and looks plain host names up in
    a dict; hashed names and patterns are matched by a scan, as OpenSSH does.

    :meth:`record` appends a new host's key under a lock and ``flock`` (two runs
    at once), reading first what another run appended meanwhile: no line is
    lost and none is written twice. ``filename`` ``None`` is a table in memory.
    """

    def __init__(self, filename: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(filename) if filename is not None else None
        #: Lines that cannot be used, as ``(line number, why)``: for a warning.
        self.skipped: list[tuple[int, str]] = []
        #: Why the file could not be read at all ("" if it could, or is absent).
        self.unreadable = ""
        self._lock = threading.Lock()
        self._clear()
        super().__init__()
        if self.path is not None and self.path.is_file():
            try:
                self.load(self.path)
            except OSError as exc:  # as OpenSSH: an unreadable file counts as empty
                self.unreadable = exc.strerror or str(exc)

    def _clear(self) -> None:
        self._by_name: dict[str, list[KnownLine]] = {}
        self._scanned: list[KnownLine] = []  # hashed names and patterns
        self._revoked: list[KnownLine] = []
        self._entries: list[paramiko.hostkeys.HostKeyEntry] = []
        self._lines = 0  # lines read (and remembered), for line numbers
        self._offset = 0  # bytes of the file read

    # ---- reading -----------------------------------------------------------------------

    def load(self, filename: Any) -> None:
        with open(filename, "rb") as stream:
            data = stream.read()
        self._offset = len(data)
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        lines = data.decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()  # what follows the last newline is not a line
        for raw in lines:
            self._lines += 1
            self._parse_line(raw.strip(), self._lines)

    def _parse_line(self, line: str, number: int) -> None:
        if not line or line.startswith("#"):
            return
        fields = line.split()
        marker = fields.pop(0) if fields[0].startswith("@") else ""
        if marker == "@cert-authority":
            self.skipped.append(
                (number, "@cert-authority: paramiko cannot check host certificates")
            )
            return
        if marker not in ("", "@revoked"):
            self.skipped.append((number, f"unknown marker {marker}"))
            return
        if len(fields) < 3:
            self.skipped.append((number, "not a 'names keytype key' line"))
            return
        names, keytype, blob = fields[:3]
        try:
            key = paramiko.PKey.from_type_string(keytype, base64.b64decode(blob, validate=True))
        except UnknownKeyType:
            self.skipped.append((number, f"key type {keytype} is not supported by paramiko"))
            return
        except (binascii.Error, ValueError, paramiko.SSHException):
            self.skipped.append((number, f"a malformed {keytype} key"))
            return
        self._index(KnownLine(tuple(names.split(",")), key, number, marker == "@revoked"))

    def _index(self, entry: KnownLine) -> None:
        if entry.revoked:
            self._revoked.append(entry)
            return
        self._entries.append(paramiko.hostkeys.HostKeyEntry(list(entry.names), entry.key))
        if any(_is_pattern(n) or n.startswith("|1|") for n in entry.names):
            self._scanned.append(entry)
        else:
            for name in entry.names:
                self._by_name.setdefault(name.lower(), []).append(entry)

    def entries(self, hostname: str) -> list[KnownLine]:
        """The trusted lines for that name (``host`` or ``[host]:port``), in file order."""
        name = hostname.lower()
        found = self._by_name.get(name, []) + [
            e for e in self._scanned if _name_matches(name, e.names)
        ]
        return sorted(found, key=lambda e: e.number) if len(found) > 1 else found

    def revokes(self, hostname: str, key: paramiko.PKey) -> bool:
        """Whether an ``@revoked`` line covering that name lists that key."""
        name = hostname.lower()
        return any(e.key == key and _name_matches(name, e.names) for e in self._revoked)

    def lookup(self, hostname: str) -> Any:
        """paramiko's question: that name's keys by type (the first line wins), or ``None``."""
        keys = _KeyMap()
        for entry in self.entries(hostname):
            keys.setdefault(entry.key.get_name(), entry.key)
        return keys or None

    # ---- writing -----------------------------------------------------------------------

    def add(self, hostname: str, keytype: str, key: paramiko.PKey) -> None:
        """paramiko's API: remember a key in memory, replacing that name's key of that type."""
        with self._lock:
            name = hostname.lower()
            kept = [e for e in self._by_name.get(name, []) if e.key.get_name() != keytype]
            self._by_name[name] = kept
            self._remember(hostname, key)

    def record(
        self, hostname: str, key: paramiko.PKey, hashed: bool = False
    ) -> paramiko.PKey | None:
        """Remember a new host's key, in memory and at the end of the file.

        ``None`` once it is remembered (now, or by another thread or run just
        before); else the other key remembered for that name meanwhile, which
        the caller refuses. ``hashed`` writes the name as ``HashKnownHosts yes``.
        """
        with self._lock:
            if self.path is None:
                return self._remember_new(hostname, key)
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.path.open("ab+") as stream:
                fcntl.flock(stream, fcntl.LOCK_EX)  # released when the file is closed
                regular = stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
                if regular:
                    self._catch_up(stream)
                remembered = self.entries(hostname)
                if remembered:
                    return _other(remembered, key)
                name = hostname.lower()
                written = paramiko.HostKeys.hash_host(name) if hashed else name
                line = f"{written} {key.get_name()} {key.get_base64()}\n".encode()
                if regular and self._offset and not _ends_with_newline(stream):
                    line = b"\n" + line
                stream.write(line)
                stream.flush()
                if regular:
                    self._offset = stream.tell()
                self._remember(hostname, key)
                return None

    def _remember_new(self, hostname: str, key: paramiko.PKey) -> paramiko.PKey | None:
        remembered = self.entries(hostname)
        if remembered:
            return _other(remembered, key)
        self._remember(hostname, key)
        return None

    def _remember(self, hostname: str, key: paramiko.PKey) -> None:
        self._lines += 1
        self._index(KnownLine((hostname.lower(),), key, self._lines))

    def _catch_up(self, stream: IO[bytes]) -> None:
        """Read what others appended since this file was read (under the caller's flock)."""
        size = os.fstat(stream.fileno()).st_size
        if size < self._offset:  # rewritten meanwhile (ssh-keygen -R): read it afresh
            self._clear()
            self.skipped = []
        if size > self._offset:
            stream.seek(self._offset)
            data = stream.read(size - self._offset)
            self._offset = size
            self._parse(data)


def _other(remembered: list[KnownLine], key: paramiko.PKey) -> paramiko.PKey | None:
    """``None`` if ``key`` is among the remembered lines' keys, else the first of them."""
    return None if any(e.key == key for e in remembered) else remembered[0].key


def _ends_with_newline(stream: IO[bytes]) -> bool:
    stream.seek(-1, os.SEEK_END)
    return stream.read(1) == b"\n"


class KnownHostsView(paramiko.HostKeys):
    """What one connection consults: its user files, then its global ones, as OpenSSH does.

    Given to paramiko as the client's host keys. Keys revoked for a name are
    left out of what it is offered. New keys go to the first user file (to a
    table in memory if there is none: ``UserKnownHostsFile none``).
    """

    def __init__(self, user: Sequence[KnownHosts], global_: Sequence[KnownHosts] = ()) -> None:
        super().__init__()
        self.user = tuple(user)
        self.writable = self.user[0] if self.user else KnownHosts()
        self.files = (*self.user, *global_, *([] if self.user else [self.writable]))

    def revoked_in(self, hostname: str, key: paramiko.PKey) -> KnownHosts | None:
        """The file with an ``@revoked`` line for that key and name, if any."""
        return next((f for f in self.files if f.revokes(hostname, key)), None)

    def source_of(self, hostname: str, key: paramiko.PKey) -> KnownHosts | None:
        """The file whose line trusts that key for that name, if any."""
        return next((f for f in self.files if any(e.key == key for e in f.entries(hostname))), None)

    def lookup(self, hostname: str) -> Any:
        """Every file's keys for that name (the first file, then line, wins), none revoked."""
        keys = _KeyMap()
        for known in self.files:
            for entry in known.entries(hostname):
                if entry.key.get_name() in keys:
                    continue
                if self.revoked_in(hostname, entry.key) is None:  # a file with no entry is falsy
                    keys[entry.key.get_name()] = entry.key
        return keys or None


def _named(known: KnownHosts | None) -> str:
    return str(known.path) if known is not None and known.path else "memory"


def keyscan_hint(hostname: str, key: paramiko.PKey, known_hosts: KnownHosts) -> str:
    """How to add that host's key by hand: an ``ssh-keyscan`` line."""
    host, port = split_name(hostname)
    port_option = "" if port == 22 else f"-p {port} "
    target = f" >> {known_hosts.path}" if known_hosts.path else ""
    return f"ssh-keyscan {port_option}-t {key.get_name()} {host}{target}"


def _revoked(where: str, key: paramiko.PKey, known: KnownHosts) -> HostKeyRefused:
    return HostKeyRefused(
        f"host key of {where} ({key.get_name()} {key.fingerprint}) is marked @revoked "
        f"in {_named(known)}: refused"
    )


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """What happens to a key no known_hosts file has, as ``StrictHostKeyChecking`` says.

    ``accept-new`` (the default, and ``no``/``off``): accepted and remembered in
    the view's first user file. ``yes`` (and ``ask``): refused, naming the host,
    the key's fingerprint and how to add it. A revoked key: refused in every mode.
    ``said`` is the value as the configuration spells it, for the message.
    """

    def __init__(
        self,
        view: KnownHostsView,
        strict: str = DEFAULT_STRICT,
        hashed: bool = False,
        said: str = "",
    ) -> None:
        self.view = view
        self.strict = strict
        self.hashed = hashed
        self.said = said or strict

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        host, port = split_name(hostname)
        revoked = self.view.revoked_in(hostname, key)
        if revoked is not None:
            raise _revoked(f"{host}:{port}", key, revoked)
        if self.strict == "yes":
            treated = "" if self.said == "yes" else " (no one to ask: treated as yes)"
            raise HostKeyRefused(
                f"host key of {host}:{port} ({key.get_name()} {key.fingerprint}) is not known "
                f"and StrictHostKeyChecking is {self.said}{treated}: check that fingerprint "
                "with the host's administrator, then add the key, e.g. "
                + keyscan_hint(hostname, key, self.view.writable)
            )
        other = self.view.writable.record(hostname, key, self.hashed)
        if other is not None:  # another connection remembered another key meanwhile
            raise paramiko.BadHostKeyException(host, key, other)


def explain_refusal(
    exc: paramiko.BadHostKeyException, hostname: str, view: KnownHostsView, what: str = ""
) -> HostKeyRefused:
    """paramiko's changed-key error in one line naming the file; ``@revoked`` said as such.

    ``hostname`` is the name looked up (``host`` or ``[host]:port``); ``what``
    prefixes the host (``"jump host "``).
    """
    host, port = split_name(hostname)
    where = f"{what}{host}:{port}"
    revoked = view.revoked_in(hostname, exc.key)
    if revoked is not None:
        return _revoked(where, exc.key, revoked)
    known = view.source_of(hostname, exc.expected_key)
    if known is not None and known.path and known not in view.user:
        fix = f"if the host was reinstalled, whoever manages {known.path} must update it"
    else:
        fix = "if the host was reinstalled, remove the old key with ssh-keygen -R "
        fix += shlex.quote(hostname)
        fix += f" -f {shlex.quote(str(known.path))}" if known is not None and known.path else ""
    return HostKeyRefused(
        f"host key of {where} does not match the one remembered in {_named(known)}: "
        f"it may be a man in the middle; {fix}"
    )


def skipped_warnings(files: Iterable[KnownHosts]) -> list[str]:
    """One warning per file and reason, naming the lines that cannot be used."""
    warnings = []
    for known in files:
        if known.unreadable:
            warnings.append(f"warning: {known.path} cannot be read ({known.unreadable}); ignored")
        reasons: dict[str, list[int]] = {}
        for number, why in known.skipped:
            reasons.setdefault(why, []).append(number)
        for why, numbers in reasons.items():
            shown = ", ".join(map(str, numbers[:10]))
            shown += f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
            warnings.append(
                f"warning: {known.path} line{'s' if len(numbers) > 1 else ''} {shown}: {why}; "
                "ignored, so a host only such a line vouches for counts as unknown"
            )
    return warnings
