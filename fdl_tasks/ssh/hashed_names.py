"""Which hashed known_hosts names (``|1|salt|hmac``) are which host, with few HMACs. No I/O.

A hashed name is the HMAC-SHA1 of the host's name keyed with a random salt of
its own, so whether a line names a host can only be known by computing that
host's HMAC with that line's salt. Scanning the file for every host of a
fan-out costs hosts x lines HMACs, and so a cost per host that grows with the
fleet. Here:

- a name already *resolved* (proved to be some host's) is looked up in a
  dict: a host's own lines cost nothing more, and no other host's lookup
  needs to try them (two names with one HMAC would be a SHA-1 collision);
- what a name was found to be is remembered across runs
  (``known``: name → host, :mod:`fdl_tasks.ssh.known_hosts_io` keeps it in the
  user's cache). A remembered answer is proved again with one HMAC when the
  line is read, so the cache can save work but never decide a match: a wrong
  or stale entry only costs the scan it would have saved;
- a name not yet resolved is tried, once, against each host looked up while
  it stays unresolved.

Per run, with ``L`` hashed lines of which ``U`` name no host of the fan-out and
``H`` hosts: ``L`` HMACs to prove the cache, then ``U`` per host. A first run,
with nothing remembered, costs about ``H x L / 2``, as OpenSSH's own scan does.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
from collections.abc import Mapping

HASHED = "|1|"


def unhash(token: str) -> tuple[bytes, bytes] | None:
    """``|1|salt|hmac`` → ``(salt, hmac)``; ``None`` if it is not one."""
    parts = token.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return None
    try:
        return base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return None


class HashedNames:
    """The hashed names of one known_hosts file and what each is known to be.

    ``known`` is what an earlier run found (name → host); :attr:`hmacs` counts
    the HMACs computed, the cost this class exists to bound.
    """

    def __init__(self, known: Mapping[str, str] | None = None) -> None:
        self._known = dict(known or {})
        self._hosts: dict[str, str] = {}  # token → host, each proved by an HMAC
        self._by_host: dict[str, set[str]] = {}  # host → its tokens
        self._open: dict[str, tuple[bytes, bytes]] = {}  # tokens no host has matched yet
        self._lock = threading.Lock()
        self.hmacs = 0

    def add(self, token: str) -> bool:
        """Take in a hashed name read from the file; ``False`` if it is malformed."""
        salted = unhash(token)
        if salted is None:
            return False
        with self._lock:
            if token in self._hosts or token in self._open:
                return True
            host = self._known.get(token)
            if host is not None and self._hmac(salted, host):
                self._resolve(token, host)
            else:
                self._open[token] = salted
        return True

    def tokens_of(self, host: str) -> set[str]:
        """The hashed names that are ``host`` (lower case), trying only the unresolved ones."""
        with self._lock:
            for token, salted in list(self._open.items()):
                if self._hmac(salted, host):
                    self._resolve(token, host)
            return set(self._by_host.get(host, ()))

    def resolved(self) -> dict[str, str]:
        """Every name proved to be a host (name → host): what the next run may remember."""
        with self._lock:
            return dict(self._hosts)

    def remembered(self) -> dict[str, str]:
        """What was known to begin with and what was proved since, for a re-read file."""
        with self._lock:
            return {**self._known, **self._hosts}

    def _hmac(self, salted: tuple[bytes, bytes], host: str) -> bool:
        self.hmacs += 1
        return hmac.compare_digest(hmac.digest(salted[0], host.encode(), "sha1"), salted[1])

    def _resolve(self, token: str, host: str) -> None:
        self._open.pop(token, None)
        self._hosts[token] = host
        self._by_host.setdefault(host, set()).add(token)
