"""known_hosts lines as OpenSSH writes them, parsed and matched in memory: no I/O here.

Understood: plain names, ``[host]:port``, hashed ``|1|`` names
(``HashKnownHosts yes``), ``*``/``?``/``!`` patterns and ``@revoked``. Lines
paramiko cannot use (``@cert-authority``, a key type it does not know) are
kept in :attr:`KnownHostsTable.skipped` with why, to be named in a warning
rather than dropped silently. Reading and appending to the files is
:mod:`fdl_tasks.ssh.known_hosts_io`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import paramiko
from paramiko.pkey import UnknownKeyType

from fdl_tasks.ssh.hashed_names import HASHED, HashedNames, unhash

_PORT_NAME = re.compile(r"\[(?P<host>.*)\]:(?P<port>[0-9]+)")


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


_unhash = functools.lru_cache(maxsize=65536)(unhash)


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


def parse_line(line: str, number: int) -> KnownLine | str | None:
    """One stripped line: its entry, why it cannot be used, or ``None`` (blank or comment)."""
    if not line or line.startswith("#"):
        return None
    fields = line.split()
    marker = fields.pop(0) if fields[0].startswith("@") else ""
    if marker == "@cert-authority":
        return "@cert-authority: paramiko cannot check host certificates"
    if marker not in ("", "@revoked"):
        return f"unknown marker {marker}"
    if len(fields) < 3:
        return "not a 'names keytype key' line"
    names, keytype, blob = fields[:3]
    try:
        key = paramiko.PKey.from_type_string(keytype, base64.b64decode(blob, validate=True))
    except UnknownKeyType:
        return f"key type {keytype} is not supported by paramiko"
    except (binascii.Error, ValueError, paramiko.SSHException):
        return f"a malformed {keytype} key"
    return KnownLine(tuple(names.split(",")), key, number, marker == "@revoked")


def other_key(remembered: list[KnownLine], key: paramiko.PKey) -> paramiko.PKey | None:
    """``None`` if ``key`` is among the remembered lines' keys, else the first of them."""
    return None if any(e.key == key for e in remembered) else remembered[0].key


class KeyMap(dict[str, paramiko.PKey]):
    """What ``SSHClient.connect`` expects from a lookup: ``keys()`` is indexable."""

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())


class KnownHostsTable(paramiko.HostKeys):
    """known_hosts lines indexed once: plain and hashed names in dicts, patterns scanned.

    ``paramiko.HostKeys.load`` checks each new line against all earlier ones
    (quadratic in the file's length) and ``lookup`` scans every entry; loading
    a file for each of N connections cost about 80 ms of controller CPU per
    host at 512 hosts. This indexes in one pass and looks plain host names up
    in a dict. Hashed names are :class:`~fdl_tasks.ssh.hashed_names.HashedNames`
    (``known``: what an earlier run found them to be). Lines with patterns or
    ``!``, and ``@revoked`` lines, are matched by a scan, as OpenSSH does.
    """

    def __init__(self, known: Mapping[str, str] | None = None) -> None:
        self.hashed = HashedNames(known)
        self._clear()
        super().__init__()

    def _clear(self) -> None:
        #: Lines that cannot be used, as ``(line number, why)``: for a warning.
        self.skipped: list[tuple[int, str]] = []
        self.hashed = HashedNames(self.hashed.remembered())  # the file re-read: same names
        self._by_name: dict[str, list[KnownLine]] = {}
        self._by_token: dict[str, list[KnownLine]] = {}  # hashed names
        self._scanned: list[KnownLine] = []  # patterns
        self._revoked: list[KnownLine] = []
        self._entries: list[paramiko.hostkeys.HostKeyEntry] = []
        self._lines = 0  # lines read (and remembered), for line numbers

    def parse(self, data: bytes) -> None:
        """Index the lines of ``data``, numbered on from the lines already read."""
        lines = data.decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()  # what follows the last newline is not a line
        for raw in lines:
            self._lines += 1
            parsed = parse_line(raw.strip(), self._lines)
            if isinstance(parsed, KnownLine):
                self._index(parsed)
            elif parsed is not None:
                self.skipped.append((self._lines, parsed))

    def _index(self, entry: KnownLine) -> None:
        if entry.revoked:
            self._revoked.append(entry)
            return
        self._entries.append(paramiko.hostkeys.HostKeyEntry(list(entry.names), entry.key))
        if any(_is_pattern(n) for n in entry.names):
            self._scanned.append(entry)
            return
        for name in entry.names:
            if not name.startswith(HASHED):
                self._by_name.setdefault(name.lower(), []).append(entry)
            elif self.hashed.add(name):  # a malformed one names no host
                self._by_token.setdefault(name, []).append(entry)

    def entries(self, hostname: str) -> list[KnownLine]:
        """The trusted lines for that name (``host`` or ``[host]:port``), in file order."""
        name = hostname.lower()
        found = self._by_name.get(name, []) + [
            e for token in self.hashed.tokens_of(name) for e in self._by_token[token]
        ]
        found += [e for e in self._scanned if _name_matches(name, e.names)]
        return sorted({e.number: e for e in found}.values(), key=lambda e: e.number)

    def revokes(self, hostname: str, key: paramiko.PKey) -> bool:
        """Whether an ``@revoked`` line covering that name lists that key."""
        return any(e.key == key and _name_matches(hostname.lower(), e.names) for e in self._revoked)

    def lookup(self, hostname: str) -> Any:
        """paramiko's question: that name's keys by type (the first line wins), or ``None``."""
        keys = KeyMap()
        for entry in self.entries(hostname):
            keys.setdefault(entry.key.get_name(), entry.key)
        return keys or None

    def add(self, hostname: str, keytype: str, key: paramiko.PKey) -> None:
        """paramiko's API: remember a key in memory, replacing that name's key of that type."""
        name = hostname.lower()
        kept = [e for e in self._by_name.get(name, []) if e.key.get_name() != keytype]
        self._by_name[name] = kept
        self._remember(hostname, key)

    def _remember_new(self, hostname: str, key: paramiko.PKey) -> paramiko.PKey | None:
        """Remember a new name's key; ``None`` once it is, else the other key remembered."""
        if remembered := self.entries(hostname):
            return other_key(remembered, key)
        self._remember(hostname, key)
        return None

    def _remember(self, hostname: str, key: paramiko.PKey) -> None:
        self._lines += 1
        self._index(KnownLine((hostname.lower(),), key, self._lines))
