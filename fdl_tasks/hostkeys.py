"""Host keys: trust on first use, a changed key always refused, known_hosts read once.

Like OpenSSH's ``StrictHostKeyChecking=accept-new``: an unknown host's key is
accepted and remembered; paramiko itself rejects a key that no longer matches.
"""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path
from typing import Any

import paramiko


class KnownHosts(paramiko.HostKeys):
    """``known_hosts`` parsed once per fan-out and shared by every connection.

    ``paramiko.HostKeys.load`` checks each new line against all earlier ones
    (quadratic in the file's length) and ``lookup`` scans every entry; loading
    the file for each of N connections cost about 80 ms of controller CPU per
    host at 512 hosts. This loads in one pass and looks plain host names up in
    a dict (hashed ``|1|`` entries are still matched by a scan, as paramiko does).
    """

    def __init__(self, filename: str | None = None) -> None:
        self._by_name: dict[str, list[paramiko.hostkeys.HostKeyEntry]] = {}
        self._hashed: list[paramiko.hostkeys.HostKeyEntry] = []
        self._lock = threading.Lock()
        super().__init__(filename)

    def load(self, filename: Any) -> None:
        with open(filename, encoding="utf-8") as stream:
            for number, line in enumerate(stream, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
                except paramiko.hostkeys.InvalidHostKey:
                    continue
                if entry is not None:
                    self._index(entry)

    def _index(self, entry: paramiko.hostkeys.HostKeyEntry) -> None:
        self._entries.append(entry)  # type: ignore[attr-defined]
        for name in entry.hostnames:
            if name.startswith("|1|"):
                self._hashed.append(entry)
            else:
                self._by_name.setdefault(name, []).append(entry)

    def add(self, hostname: str, keytype: str, key: paramiko.PKey) -> None:
        with self._lock:
            for entry in self._by_name.get(hostname, []):
                if entry.key.get_name() == keytype:
                    entry.key = key
                    return
            self._index(paramiko.hostkeys.HostKeyEntry([hostname], key))

    def lookup(self, hostname: str) -> Any:
        matches = self._by_name.get(hostname, []) + [
            entry
            for entry in self._hashed
            if self._hostname_matches(hostname, entry)  # type: ignore[attr-defined]
        ]
        if not matches:
            return None
        keys = _KeyMap()
        for entry in matches:
            keys.setdefault(entry.key.get_name(), entry.key)
        return keys


class _KeyMap(dict[str, paramiko.PKey]):
    """What ``SSHClient.connect`` expects from a lookup: ``keys()`` is indexable."""

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept and remember an unknown host key; paramiko itself rejects a changed one.

    Adds to the fan-out's shared :class:`KnownHosts` and appends to the file
    under a thread lock and ``flock`` (two runs at once), so that concurrent
    first connections do not overwrite each other's entries.
    """

    _lock = threading.Lock()

    def __init__(self, known_hosts: Path, shared: KnownHosts) -> None:
        self.known_hosts = known_hosts
        self.shared = shared

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        with self._lock:
            self.shared.add(hostname, key.get_name(), key)
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a", encoding="utf-8") as stream:
                fcntl.flock(stream, fcntl.LOCK_EX)
                stream.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
