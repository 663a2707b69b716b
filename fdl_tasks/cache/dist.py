"""Distributed compiles with sccache-dist: the pure parts (no I/O).

``controller.dist`` names a scheduler and where the client token lives (a
file on the controller, or a variable of the controller's environment). The
scheduler and its build servers are the user's, started with sccache's own
``sccache-dist``; fdl-tasks only configures the sccache client of each build:

- a client configuration (TOML, the token inside, mode 0600 on the controller)
  that ``SCCACHE_CONF`` points at, read-only in containers;
- a small wrapper, :data:`WRAPPER_SCRIPT`, as ``RUSTC_WRAPPER``: sccache
  compiles a unit remotely where it can, and a unit whose remote compile fails
  (a static library that sccache does not ship, a compiler package the server
  cannot run, a token the scheduler refuses) is compiled again locally, by the
  compiler alone, whose result is the one cargo gets;
- the counts read back: remote compiles next to the cache's hits.

Here: the value checks for cluster.yaml, the client configuration's text,
the wrapper's text, and the readings of the scheduler's and sccache's answers.
"""

from __future__ import annotations

import ipaddress
import re
import struct
import urllib.parse

import attrs

from fdl_tasks.config.values import InvalidValue
from fdl_tasks.core.errors import passed

#: What an HTTP header value can carry: visible ASCII (a token is one such word).
_TOKEN = re.compile(r"[\x21-\x7e]+")


def check_token(token: str, where: str) -> str:
    """The client token, stripped of surrounding blanks; ``where`` names its source.

    The messages never show the token, nor any part of it.
    """
    token = token.strip()
    if not token:
        raise InvalidValue(f"{where} holds no token")
    return passed(
        token,
        _TOKEN.fullmatch,
        lambda: InvalidValue(
            f"{where} holds characters a token cannot carry: a token is one word of "
            "visible ASCII, such as what 'sccache-dist auth generate-shared-token' prints"
        ),
    )


#: What a TOML basic string escapes: quotes, backslashes and control characters.
_TOML_ESCAPES = {c: f"\\u{c:04x}" for c in (*range(0x20), 0x7F)} | {ord(c): "\\" + c for c in '"\\'}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quotes, backslashes and controls escaped)."""
    return '"' + text.translate(_TOML_ESCAPES) + '"'


def client_config(scheduler_url: str, token: str, packages_dir: str) -> str:
    """The sccache client configuration: the scheduler, the token, the compiler packages.

    ``packages_dir`` is where sccache keeps the compiler packages it packs and
    ships (its "toolchains": a few hundred MB per Rust release, packed once, then
    reused).
    """
    return (
        "# Written by fdl-tasks for its builds; holds a secret (mode 0600).\n"
        "[dist]\n"
        f"scheduler_url = {toml_string(scheduler_url)}\n"
        "toolchains = []\n"
        f"cache_dir = {toml_string(packages_dir)}\n"
        "\n"
        "[dist.auth]\n"
        'type = "token"\n'
        f"token = {toml_string(token)}\n"
    )


def is_loopback_url(url: str) -> bool:
    """Does the URL name this machine (``localhost``, 127.0.0.0/8, ``::1``)?

    A build container on Docker's default network cannot reach such an
    address (nor the build servers a loopback scheduler hands out): it needs
    the host's network.
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def scheduler_endpoint(url: str, name: str) -> str:
    """One of the scheduler's API endpoints (``status``, ``alloc_job``) under its URL."""
    return urllib.parse.urljoin(url.rstrip("/") + "/", f"api/v1/scheduler/{name}")


@attrs.frozen
class SchedulerStatus:
    """What the scheduler said about itself."""

    servers: int
    cpus: int
    in_progress: int

    def describe(self) -> str:
        servers = f"{self.servers} build server{'' if self.servers == 1 else 's'}"
        return f"{servers}, {self.cpus} CPU{'' if self.cpus == 1 else 's'}"


def parse_scheduler_status(body: bytes) -> SchedulerStatus | None:
    """The scheduler's ``status`` answer: three little-endian 64-bit counts
    (servers, CPUs, jobs in progress), as sccache-dist 0.16 encodes them;
    ``None`` for anything else (another version: only the answer itself counts)."""
    if len(body) != 24:
        return None
    return SchedulerStatus(*struct.unpack("<QQQ", body))


def parse_dist_status(text: str) -> str | None:
    """``sccache --dist-status``'s JSON key: ``SchedulerStatus`` (connected),
    ``NotConnected``, ``Disabled``…; ``None`` if there is no such answer."""
    match = re.match(r'\s*\{\s*"(\w+)"', text)
    return match.group(1) if match else None


#: ``RUSTC_WRAPPER`` when compiles are distributed (named ``sccache``: the cc crate
#: then wraps C compilers with it too). ``$FDL_SCCACHE`` is the real sccache,
#: ``$FDL_DIST_LOCK`` a file locked while a build's sccache server starts.
#: A compile read from standard input is left to sccache (it runs those locally,
#: and standard input cannot be read twice). A failed attempt's output is dropped:
#: the local compile's diagnostics, or its object, are what cargo gets.
WRAPPER_SCRIPT = r"""#!/bin/sh
# fdl-tasks: sccache with distributed compiles, and a local compile of any
# unit whose attempt through sccache fails (a static library sccache does not
# ship to the build server, a toolchain the server cannot run, a refused token).
# sccache servers sharing one toolchain directory must not start together (each
# start empties its scratch directory: "toolchain_tmp: File exists").
if [ ! -S "${SCCACHE_SERVER_UDS:-}" ] && [ -n "${FDL_DIST_LOCK:-}" ] &&
  command -v flock >/dev/null 2>&1; then
  flock -o "$FDL_DIST_LOCK" sh -c \
    '[ -S "$SCCACHE_SERVER_UDS" ] || "$FDL_SCCACHE" --start-server' >/dev/null 2>&1
fi
for arg do
  if [ "$arg" = - ]; then exec "$FDL_SCCACHE" "$@"; fi
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fdl-dist.XXXXXX") || exec "$FDL_SCCACHE" "$@"
"$FDL_SCCACHE" "$@" >"$tmp/out" 2>"$tmp/err"
status=$?
if [ "$status" -eq 0 ]; then
  cat "$tmp/out"
  cat "$tmp/err" >&2
  rm -rf "$tmp"
  exit 0
fi
rm -rf "$tmp"
unit=
previous=
for arg do
  case "$previous" in
    --crate-name) unit=$arg ;;
    -o) [ -n "$unit" ] || unit=${arg##*/} ;;
  esac
  previous=$arg
done
[ -n "$unit" ] || unit=${1##*/}
echo "$unit" >>"${SCCACHE_SERVER_UDS:-${TMPDIR:-/tmp}/fdl-sccache}.fallbacks" 2>/dev/null
echo "fdl-tasks: $unit: compiling through sccache failed (exit $status); compiling it locally" >&2
exec "$@"
"""


def fallback_units(text: str) -> tuple[str, ...]:
    """The units the wrapper compiled locally, once each, in order."""
    return tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
