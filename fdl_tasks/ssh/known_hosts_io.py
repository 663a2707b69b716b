"""Host keys as OpenSSH checks them: known_hosts files read once, StrictHostKeyChecking honoured.

The I/O and paramiko side; parsing and matching lines is :mod:`fdl_tasks.ssh.known_hosts`,
the decisions and their messages :mod:`fdl_tasks.ssh.hostkey_policy`.

- :class:`KnownHosts` is one known_hosts file, read once per fan-out and shared
  by every connection that reads it; new keys are appended to it.
- :class:`KnownHostsView` is what one connection consults: its user files,
  then its global ones, as OpenSSH reads ``UserKnownHostsFile`` and
  ``GlobalKnownHostsFile``. A revoked key is never offered as a trusted one.
- :class:`TrustOnFirstUse` is the policy for a key that no file knows:
  refused under ``StrictHostKeyChecking yes`` (the error names the host and how
  to add its key), else accepted and remembered in the first user file.
- :class:`SharedHostKeys` gives each connection of a fan-out its view and
  policy, each file, view and policy built once.

A key that no longer matches a remembered one is refused by paramiko itself,
in every mode (it may be a man in the middle); :func:`explain_refusal` says so
in one line naming the file that holds the old key.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import paramiko

from fdl_tasks.core.locks import FileLock
from fdl_tasks.ssh.hashed_names_io import read_names, write_names
from fdl_tasks.ssh.hostkey_policy import (
    DEFAULT_STRICT,
    HostKeyRefused,
    added_lines,
    changed_refusal,
    file_warnings,
    revoked_refusal,
    unknown_refusal,
    unstrict,
    unstrict_warning,
)
from fdl_tasks.ssh.known_hosts import KeyMap, KnownHostsTable, other_key, split_name
from fdl_tasks.ssh.sshconfig import HostKeyOptions


class KnownHosts(KnownHostsTable):
    """One ``known_hosts`` file, read once per fan-out and shared by every connection.

    :meth:`record` appends a new host's key under a thread lock and the file's
    :class:`~fdl_tasks.core.locks.FileLock` (two runs at once), reading first what
    another run appended meanwhile: no line is lost and none is written twice.
    ``filename`` ``None`` is a table in memory. Its hashed names start from what
    an earlier run found them to be (:mod:`fdl_tasks.ssh.hashed_names_io`).
    """

    def __init__(self, filename: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(filename) if filename is not None else None
        self._names = read_names(self.path) if self.path is not None else {}
        #: Why the file could not be read at all ("" if it could, or is absent).
        self.unreadable = ""
        self._lock = threading.Lock()
        self._offset = 0  # bytes of the file read
        super().__init__(self._names)
        if self.path is not None and self.path.is_file():
            try:
                self.load(self.path)
            except OSError as exc:  # as OpenSSH: an unreadable file counts as empty
                self.unreadable = exc.strerror or str(exc)

    def load(self, filename: Any) -> None:
        with open(filename, "rb") as stream:
            data = stream.read()
        self._offset = len(data)
        self.parse(data)

    def remember_names(self) -> None:
        """Keep what the hashed names were found to be, for the next run, if it changed."""
        if self.path is not None and (names := self.hashed.resolved()) != self._names:
            write_names(self.path, names)
            self._names = names

    def add(self, hostname: str, keytype: str, key: paramiko.PKey) -> None:
        """paramiko's API, under the lock that :meth:`record` takes."""
        with self._lock:
            super().add(hostname, keytype, key)

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
                FileLock(self.path, stream).take(wait=True)  # released when the file is closed
                regular = stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
                if regular:
                    self._catch_up(stream)
                if remembered := self.entries(hostname):
                    return other_key(remembered, key)
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

    def _catch_up(self, stream: IO[bytes]) -> None:
        """Read what others appended since this file was read (under the caller's file lock)."""
        size = os.fstat(stream.fileno()).st_size
        if size < self._offset:  # rewritten meanwhile (ssh-keygen -R): read it afresh
            self._clear()
            self._offset = 0
        if size > self._offset:
            stream.seek(self._offset)
            data = stream.read(size - self._offset)
            self._offset = size
            self.parse(data)


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
        keys = KeyMap()
        for known in self.files:
            for entry in known.entries(hostname):
                name = entry.key.get_name()
                if name not in keys and self.revoked_in(hostname, entry.key) is None:
                    keys[name] = entry.key  # (a file with no entry is falsy: hence "is None")
        return keys or None


@attrs.define(eq=False)
class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """What happens to a key no known_hosts file has, as ``StrictHostKeyChecking`` says.

    ``accept-new`` (the default, and ``no``/``off``): accepted and remembered in
    the view's first user file. ``yes`` (and ``ask``): refused, naming the host,
    the key's fingerprint and how to add it. A revoked key: refused in every mode.
    ``said`` is the value as the configuration spells it, for the message.
    """

    view: KnownHostsView
    strict: str = DEFAULT_STRICT
    hashed: bool = False
    said: str = ""
    #: Each key accepted and remembered: name, key type, file (``None``: memory).
    added: list[tuple[str, str, Path | None]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        self.said = self.said or self.strict

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        host, port = split_name(hostname)
        if (revoked := self.view.revoked_in(hostname, key)) is not None:
            raise revoked_refusal(f"{host}:{port}", key, revoked.path)
        if self.strict == "yes":
            raise unknown_refusal(hostname, key, self.said, self.view.writable.path)
        other = self.view.writable.record(hostname, key, self.hashed)
        if other is not None:  # another connection remembered another key meanwhile
            raise paramiko.BadHostKeyException(host, key, other)
        self.added.append((hostname, key.get_name(), self.view.writable.path))


def explain_refusal(
    exc: paramiko.BadHostKeyException, hostname: str, view: KnownHostsView, what: str = ""
) -> HostKeyRefused:
    """paramiko's changed-key error in one line naming the file; ``@revoked`` said as such.

    ``hostname`` is the name looked up (``host`` or ``[host]:port``); ``what``
    prefixes the host (``"jump host "``).
    """
    host, port = split_name(hostname)
    where = f"{what}{host}:{port}"
    if (revoked := view.revoked_in(hostname, exc.key)) is not None:
        return revoked_refusal(where, exc.key, revoked.path)
    known = view.source_of(hostname, exc.expected_key)
    path = known.path if known is not None else None
    return changed_refusal(where, hostname, path, path is not None and known not in view.user)


def skipped_warnings(files: Iterable[KnownHosts]) -> list[str]:
    """One warning per file and reason, naming the lines that cannot be used."""
    return [w for f in files for w in file_warnings(f.path, f.unreadable, f.skipped)]


class SharedHostKeys:
    """Host-key checking for one fan-out, shared by all its connections and hops.

    Each known_hosts file is read once, and there is one view per list of
    files and one policy per host-key options, not one per connection.
    """

    def __init__(self) -> None:
        self._no_system_keys = KnownHosts()
        self._known_hosts: dict[str, KnownHosts] = {}  # by file, each parsed once
        self._views: dict[tuple[tuple[str, ...], tuple[str, ...]], KnownHostsView] = {}
        self._policies: dict[HostKeyOptions, TrustOnFirstUse] = {}
        self._unstrict: list[str] = []  # hosts whose configuration says StrictHostKeyChecking no
        self._added: list[tuple[str, str, Path | None]] = []  # keys accepted, not yet said

    def guard(
        self, label: str, client: paramiko.SSHClient, options: HostKeyOptions
    ) -> KnownHostsView:
        """Make ``client`` (host ``label``'s or a hop's) check keys as ``options`` say; its view."""
        if unstrict(options.said) and label not in self._unstrict:
            self._unstrict.append(label)
        view = self._view(options)
        # paramiko has no setter: share parsed known_hosts files instead of N copies
        client._system_host_keys = self._no_system_keys  # type: ignore[attr-defined]
        client._host_keys = view  # type: ignore[attr-defined]
        client.set_missing_host_key_policy(self._policy(options, view))
        return view

    def warnings(self) -> list[str]:
        """Lines no file could use, and the hosts that said StrictHostKeyChecking no."""
        unstrict_hosts = [unstrict_warning(self._unstrict)] if self._unstrict else []
        return skipped_warnings(self._known_hosts.values()) + unstrict_hosts

    def take_added(self) -> list[str]:
        """One line per file for the keys accepted since the last call (as OpenSSH's
        "Permanently added"); those keys are then said, and the hashed names found
        are remembered for the next run."""
        added, self._added[:] = list(self._added), []
        for known in self._known_hosts.values():
            known.remember_names()
        return added_lines(added)

    def _view(self, options: HostKeyOptions) -> KnownHostsView:
        """The known_hosts files a host reads, each parsed once for the whole fan-out."""
        files = (options.user_files, options.global_files)
        if files not in self._views:
            for path in {*options.user_files, *options.global_files} - set(self._known_hosts):
                self._known_hosts[path] = KnownHosts(path)
            self._views[files] = KnownHostsView(
                [self._known_hosts[p] for p in options.user_files],
                [self._known_hosts[p] for p in options.global_files],
            )
        return self._views[files]

    def _policy(self, options: HostKeyOptions, view: KnownHostsView) -> TrustOnFirstUse:
        if options not in self._policies:
            self._policies[options] = TrustOnFirstUse(
                view, options.strict, options.hashed, options.said, self._added
            )
        return self._policies[options]
