"""The controller's side of sccache-dist: the token read, the scheduler asked, the
client files written (the pure parts are in :mod:`fdl_tasks.cache.dist`).

The wrapper and the client configuration go beside the compile cache, on the
controller's disk, and are mounted read-only into containers.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import attrs

from fdl_tasks.cache.dist import (
    WRAPPER_SCRIPT,
    SchedulerStatus,
    check_token,
    client_config,
    is_loopback_url,
    parse_scheduler_status,
    scheduler_endpoint,
)
from fdl_tasks.config.model import DistSettings
from fdl_tasks.config.values import InvalidValue
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import Report, Severity

#: Where a container sees the dist client's wrapper and configuration (read-only).
CONTAINER_DIST = "/opt/fdl-sccache-dist"
#: Where a container sees the compiler packages sccache packs and ships (read-write;
#: the path keeps sccache's own word for them, "toolchains").
CONTAINER_COMPILER_PACKAGES = "/fdl-sccache-toolchains"
#: Locked while a build's sccache server starts (servers sharing the compiler
#: packages must not start together: each start empties sccache's scratch directory).
START_LOCK = ".fdl-sccache-start.lock"
#: Seconds the scheduler may take to answer before any build.
SCHEDULER_TIMEOUT = 5.0


@attrs.frozen
class DistClient:
    """The controller's side of distributed compiles: the scheduler, and the directory
    (beside the cache, ``<cache>-dist``, mode 0700) holding the wrapper and the client
    configuration for native builds (``native/``) and containers (``container/``), and
    the compiler packages sccache packs and ships (``toolchains/native``,
    ``toolchains/container``, sccache's name: it knows a package by the compiler's
    contents alone, not its path, so the same rustc seen at another path in a
    container must not find the native package, whose paths it would not run)."""

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


def connect_client(client: DistClient, dist: DistSettings, report: Report) -> DistClient | None:
    """Before any build: the token read (a clear error if it cannot be), the
    scheduler asked whether it answers and accepts the token (refused: an error),
    then the client files written; ``report`` gets the warnings and the line
    saying where compiles go.

    Returns the client with the scheduler's status, or ``None`` when the
    scheduler does not answer (this run's compiles stay local).
    """
    token, source = read_token(dist, report)
    status = probe_scheduler(dist.scheduler_url, token, source)
    if isinstance(status, str):
        report(
            f"warning: the sccache-dist scheduler at {dist.scheduler_url} does not answer "
            f"({status}): this run compiles locally (with the cache); start the scheduler, "
            "or remove controller.dist",
            Severity.WARNING,
        )
        return None
    client = attrs.evolve(client, status=status)
    if status is not None and status.servers == 0:
        report(
            f"warning: the sccache-dist scheduler at {dist.scheduler_url} has no build "
            "server yet: compiles stay local until one registers",
            Severity.WARNING,
        )
    _write_client_files(client, token)
    report(f"compile cache: {client.describe()}")
    return client


def read_token(dist: DistSettings, report: Report) -> tuple[str, str]:
    """The client token and where it came from (``controller.dist.token_file ~/x``).

    Every message names the source and never shows the token.
    """
    if dist.token_env:
        source = f"controller.dist.token_env ${dist.token_env}"
        if (value := os.environ.get(dist.token_env)) is None:
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
                f"(mode {stat.S_IMODE(mode):o}); chmod 600 {shlex.quote(str(path))}",
                Severity.WARNING,
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
    import urllib.error  # here: only ``controller.dist`` asks, and every inv loads this
    import urllib.request

    try:
        with urllib.request.urlopen(scheduler_endpoint(url, "status"), timeout=timeout) as reply:
            status = parse_scheduler_status(reply.read(4096))
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {scheduler_endpoint(url, 'status')}"
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", None) or exc)
    request = urllib.request.Request(
        scheduler_endpoint(url, "alloc_job"),
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"},
    )
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            said = exc.read(200).decode("utf-8", "replace").strip()
            raise FdlError(
                f"controller.dist: the sccache-dist scheduler at {url} refused the client "
                f"token from {source} (HTTP {exc.code}{': ' + said if said else ''}); use "
                "the token of the scheduler's [client_auth] section."
            ) from None
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", None) or exc)
    return status


def _write_client_files(client: DistClient, token: str) -> None:
    """``<cache>-dist/{native,container}/{sccache,client.toml}`` and ``toolchains/*`` (the
    compiler packages):
    the directory 0700, the configurations (which hold the token) 0600."""
    try:
        root = Path(client.directory)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
        packages = root / "toolchains"
        packages.mkdir(exist_ok=True)
        for name, packages_dir in (
            ("native", str(packages / "native")),
            ("container", CONTAINER_COMPILER_PACKAGES),
        ):
            (packages / name).mkdir(exist_ok=True)
            directory = root / name
            directory.mkdir(exist_ok=True)
            _write_private(directory / "sccache", WRAPPER_SCRIPT, 0o755)
            config = client_config(client.scheduler_url, token, packages_dir)
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
