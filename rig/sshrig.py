"""Simulated remote worker hosts, each served by its own real OpenSSH ``sshd`` on loopback.

Every :class:`HostSpec` becomes one ``/usr/sbin/sshd -D`` instance with its own host key,
listening on its own loopback address (``127.0.0.2``, ``127.0.0.3``, ...) and port, and
accepting a client ed25519 key the rig generates (:attr:`Rig.client_key`).

No aarch64 host (but through qemu-user, below), musl host, old-glibc host or pkill-less
host can exist on this machine, so **CPU arch and libc are simulated by per-host shims
served through a real sshd**: each host's sshd has ``ForceCommand <host_dir>/session.sh``,
a wrapper that sets the host's environment, puts ``<host_dir>/bin`` (the shims) first on
``PATH`` and then runs the client's command with
``exec "$SHELL" -c "$SSH_ORIGINAL_COMMAND"``, so exit codes, stdin, stdout and stderr
are the command's own, for OpenSSH and paramiko/Fabric exec requests alike (and sftp,
whose subsystem command goes through the same wrapper). The wrapper, the sshd config
and the shims are the files of ``rig/templates`` with their ``@{name}`` placeholders
filled in. The shims:

- ``uname`` / ``arch`` (when ``uname_m`` or ``emulate`` is set): ``uname -m`` /
  ``uname --machine`` / ``arch`` print the simulated machine (nothing at all for ``""``);
  any other invocation execs the real command.
- ``ldd`` (when ``libc="musl"`` or ``glibc_version`` is set): only ``ldd --version`` is
  faked.  musl prints the real musl loader banner *on stderr* and exits 1, exactly like
  musl's ``ldd``; a glibc version replaces the first line with ``ldd (GNU libc) X.Y``
  (stdout, exit 0).  ``ldd /some/binary`` always runs the real glibc ``ldd``.
- ``getconf GNU_LIBC_VERSION`` follows the same simulated libc (``glibc X.Y``; on musl an
  "unknown variable" error on stderr, exit 1).
- ``pkill=False``: ``PATH`` is ``<host_dir>/bin:<host_dir>/sysbin`` where ``sysbin`` holds
  symlinks to every system command except ``pkill``, so ``command -v pkill`` fails
  (``/usr/bin/pkill`` by absolute path still exists: it is the same machine).

``uname_m="aarch64"`` alone is an x86_64 machine that only *says* aarch64 (enough for
preflight's refusal). ``emulate="aarch64"`` is a host that really runs aarch64 programs:
``uname -m`` says aarch64, aarch64 ELF files run under qemu-user through binfmt (set up by
``python3 -m rig.cross ensure``) with the session's ``QEMU_LD_PREFIX`` pointing qemu at the
aarch64 ``/lib``, and ``ldd`` is ``rig/templates/ldd-aarch64.sh``, which traces aarch64 files
with the aarch64 loader (``libx.so => not found`` lines, as ldd on such a machine prints).
The host's other commands are this machine's own, and so is ``ldd --version``: the arm64
runtime qemu uses is the same glibc release.

Remote commands run under the login user's shell (bash for root and ``fdlrig``) with
``SHLVL=1`` set by sshd and the wrapper, so bash does not source ``~/.bashrc`` (which
on this machine prepends pyenv/cargo dirs to ``PATH`` and would run before the shims).

Limitations of the simulation: a command that starts a *login* shell (``bash -lc ...``)
gets ``PATH`` reset by ``/etc/profile`` and sees the real machine; absolute paths
(``/usr/bin/uname``) see the real machine too.

State: everything (client key, host keys, sshd configs, logs, pid files, ``rig.json``
with the host specs) lives in the state directory, so ``Rig(state_dir).down()`` or
``python -m rig.sshrig down STATE_DIR`` tears a rig down from any process.  ``down()``
stops processes only and deletes nothing but its pid files (keys survive a later
``up()``).  Side effects outside the state dir, all idempotent and left in place:
``/run/sshd`` (sshd's privilege-separation dir) is created; the non-root login user
``fdlrig`` is created (``useradd``, shell bash, password field ``*`` so that sshd with
``UsePAM no`` does not treat it as locked); when a host uses ``fdlrig``, the state dir and
its ancestors get the ``o+x`` (traverse-only) bit so that user can reach its shims and
the shared authorized-keys file (pytest's ``/tmp/pytest-of-root`` is ``0700``).

Process hygiene: ``down()`` stops each host's session processes (leaves first, so every
parent reaps its children), then its sshd/hang listener, then any stray process whose
environment carries this host's ``FDLRIG_HOST_DIR`` marker, then any listener whose
command line names this state dir but no pid file does.  sshd is exec'd as a child
subreaper so that session children orphaned by sshd's privsep monitor are reaped by the
listener rather than by PID 1.  A listener started by the current process is reaped by
it; one started by a process that has since exited belongs to PID 1, and may show as
``[sshd] <defunct>`` for a while after ``down()`` if PID 1 reaps lazily (this sandbox's
does): it is dead, not running.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, get_args

import psutil

from fdl_tasks.core.atomic_files import log_tail, write_atomically

__all__ = ["DEFAULT_PORT", "RIG_USER", "HostSpec", "Rig", "RigError"]

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PRIVSEP_DIR = Path("/run/sshd")
RIG_USER = "fdlrig"
RIG_USER_SHELL = "/bin/bash"
DEFAULT_PORT = 2222
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
ENV_MARKER = "FDLRIG_HOST_DIR"
STATE_FILE = "rig.json"
TEMPLATES = Path(__file__).resolve().parent / "templates"
MUSL_VERSION = "1.2.4"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

Listen = Literal["sshd", "none", "hang"]
User = Literal["root", "fdlrig"]
Libc = Literal["glibc", "musl"]
Data = Literal["ok", "missing", "unreadable"]
Emulate = Literal["aarch64"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9/._+@:,=-]+$")
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)+$")

# A listener that accepts TCP connections and never sends a byte (argv: addr port marker).
_HANG_SCRIPT = """\
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(128)
held = []
while True:
    conn, _ = s.accept()
    held.append(conn)
"""

# Exec sshd as a "child subreaper" (prctl PR_SET_CHILD_SUBREAPER survives execve): sshd's
# privsep monitor may exit before reaping its session child (non-root logins), and the
# orphan would go to PID 1, which may not reap (it does not in some sandboxes); with this
# it goes to the sshd listener, whose SIGCHLD handler reaps any child.
_SUBREAPER_EXEC = (
    "import ctypes, os, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)

# Listener processes started by *this* process, by state dir, so down() can reap them
# (no zombie) even when another process already killed them and removed the pid files.
_CHILDREN: dict[Path, list[subprocess.Popen[bytes]]] = {}


class RigError(RuntimeError):
    """The rig could not be brought up, reconfigured or torn down."""


def _check_literal(field: str, value: object, allowed: Any) -> None:
    options = get_args(allowed)
    if value not in options:
        raise ValueError(f"HostSpec.{field} must be one of {options!r}, got {value!r}")


@dataclass(frozen=True)
class HostSpec:
    """One simulated worker host."""

    name: str
    """Host label, e.g. ``node-a``; names the host's directory under ``state_dir/hosts``."""
    address: str
    """Loopback address the host's sshd listens on, e.g. ``127.0.0.2``."""
    port: int = DEFAULT_PORT
    listen: Listen = "sshd"
    """``sshd``: a real sshd; ``none``: nothing listens (connect refused); ``hang``:
    accepts TCP and never sends a byte (banner timeout)."""
    user: User = "root"
    """Login user; ``fdlrig`` is a non-root user the rig creates."""
    uname_m: str | None = None
    """``None``: the real ``uname -m``; else what ``uname -m`` prints (``""``: nothing)."""
    libc: Libc = "glibc"
    glibc_version: str | None = None
    """E.g. ``"2.17"``: ``ldd --version`` reports that glibc; ``None``: the real one."""
    pkill: bool = True
    """``False``: ``command -v pkill`` fails on that host."""
    data: Data = "ok"
    """The host's data dir (:meth:`Rig.data_path`): present and readable; absent; present
    but ``0700 root`` (unreadable for ``fdlrig``; root reads anything)."""
    emulate: Emulate | None = None
    """``"aarch64"``: a host of that CPU, whose programs run under qemu (see the module
    docstring); not combined with ``uname_m``, ``libc`` or ``glibc_version``."""
    gpus: str | None = None
    """A profile of :mod:`rig.gpushims`: ``nvidia-smi`` / ``rocminfo`` print real captures."""
    sftp: bool = True
    """``False``: the sshd has no ``Subsystem sftp`` line and refuses the subsystem, as
    hardened images do."""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"HostSpec.name must match {_NAME_RE.pattern}, got {self.name!r}")
        try:
            socket.inet_aton(self.address)
        except OSError:
            raise ValueError(
                f"HostSpec.address must be an IPv4 address, got {self.address!r}"
            ) from None
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"HostSpec.port must be 1..65535, got {self.port!r}")
        _check_literal("listen", self.listen, Listen)
        _check_literal("user", self.user, User)
        _check_literal("libc", self.libc, Libc)
        _check_literal("data", self.data, Data)
        if self.uname_m is not None and not re.match(r"^[A-Za-z0-9_.-]*$", self.uname_m):
            raise ValueError(f"HostSpec.uname_m looks wrong: {self.uname_m!r}")
        self._check_emulation()
        if self.glibc_version is not None:
            if self.libc != "glibc":
                raise ValueError("HostSpec.glibc_version only makes sense with libc='glibc'")
            if not _VERSION_RE.match(self.glibc_version):
                raise ValueError(
                    f"HostSpec.glibc_version must look like '2.17', got {self.glibc_version!r}"
                )

    def _check_emulation(self) -> None:
        if self.emulate is None:
            return
        _check_literal("emulate", self.emulate, Emulate)
        if self.uname_m is not None or self.libc != "glibc" or self.glibc_version is not None:
            raise ValueError(
                "HostSpec.emulate is a whole machine: it cannot be combined with uname_m, "
                "libc or glibc_version"
            )

    @property
    def machine(self) -> str | None:
        """What ``uname -m`` prints there, when it is not this machine's (``None``)."""
        return self.emulate if self.emulate is not None else self.uname_m

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> HostSpec:
        return cls(**raw)


# --------------------------------------------------------------------------- processes


_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _running(process: psutil.Process) -> bool:
    """Whether it still runs (a zombie has exited: only its parent's wait is missing)."""
    try:
        return process.status() not in _GONE
    except psutil.NoSuchProcess:
        return False


def _alive(pid: int) -> bool:
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def _cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ('' if it is gone)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def _descendants(root: int) -> dict[int, tuple[int, bool]]:
    """Descendants of ``root``, zombies included, as {pid: (ppid, alive)}."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found: dict[int, tuple[int, bool]] = {}
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            found[child.pid] = (child.ppid(), _running(child))
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap_registered(state_dir: Path, pid: int | None = None) -> None:
    """Reap (wait for) our own dead children, so they leave no zombie behind."""
    kept: list[subprocess.Popen[bytes]] = []
    for proc in _CHILDREN.get(state_dir, []):
        if pid is not None and proc.pid != pid:
            kept.append(proc)
            continue
        if proc.poll() is None:
            kept.append(proc)
    _CHILDREN[state_dir] = kept


def _wait_gone(pids: Sequence[int], timeout: float, state_dir: Path) -> list[int]:
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        _reap_registered(state_dir)
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.02)
    return left


def _kill_tree(root: int, state_dir: Path) -> None:
    """Stop ``root``'s descendants leaves first, then root.

    Only a process with no child at all (not even an unreaped zombie) is signalled, so
    every parent is still alive to reap its children: nothing is left to PID 1.
    """
    deadline = time.monotonic() + STOP_TIMEOUT
    signalled: set[int] = set()
    while time.monotonic() < deadline:
        desc = _descendants(root)
        if not desc:
            break
        parents = {ppid for ppid, _ in desc.values()}
        for pid, (_, alive) in desc.items():
            if alive and pid not in parents and pid not in signalled:
                _signal(pid, signal.SIGTERM)
                signalled.add(pid)
        time.sleep(0.02)
    for pid, (_, alive) in _descendants(root).items():
        if alive:
            _signal(pid, signal.SIGKILL)
    _signal(root, signal.SIGTERM)
    if _wait_gone([root], STOP_TIMEOUT, state_dir):
        _signal(root, signal.SIGKILL)
        if _wait_gone([root], STOP_TIMEOUT, state_dir):
            raise RigError(f"process {root} survived SIGKILL")


def _marked_pids(host_dir: Path) -> list[int]:
    """Live processes whose environment carries this host's session marker."""
    me = os.getpid()
    return [
        process.pid
        for process in psutil.process_iter(["environ"])
        if process.pid != me
        and (process.info["environ"] or {}).get(ENV_MARKER) == str(host_dir)
        and _running(process)
    ]


# --------------------------------------------------------------------------- misc helpers


def _run(argv: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RigError(
            f"{what} failed (exit {proc.returncode}): {shlex.join(argv)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def _write(path: Path, text: str, mode: int) -> None:
    write_atomically(path, text)
    os.chmod(path, mode)


def _mkdir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    return path


def _port_free(spec: HostSpec) -> None:
    """Raise RigError if address:port cannot be bound (taken, or address not local)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((spec.address, spec.port))
        sock.listen(1)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RigError(
                f"host {spec.name!r}: {spec.address}:{spec.port} is already in use by another "
                "process (another rig? try `python -m rig.sshrig down STATE_DIR`, or pick "
                "another address/port)"
            ) from None
        raise RigError(
            f"host {spec.name!r}: cannot bind {spec.address}:{spec.port}: {exc.strerror}"
        ) from None
    finally:
        sock.close()


def _sh_quote(value: str) -> str:
    return shlex.quote(value)


def _real(cmd: str) -> str:
    found = shutil.which(cmd, path=os.pathsep.join(SYSTEM_PATH))
    if found is None:
        raise RigError(f"`{cmd}` not found on {':'.join(SYSTEM_PATH)}")
    return found


def _real_machine() -> str:
    return os.uname().machine


def _check_endpoints(specs: Sequence[HostSpec]) -> None:
    """No two hosts on one address:port (a later spec of the same name replaces the earlier)."""
    want = {spec.name: spec for spec in specs}
    endpoints: dict[tuple[str, int], str] = {}
    for spec in want.values():
        other = endpoints.setdefault((spec.address, spec.port), spec.name)
        if other != spec.name:
            raise RigError(f"hosts {other!r} and {spec.name!r} both use {spec.address}:{spec.port}")


# --------------------------------------------------------------------------- shims


_PLACEHOLDER = re.compile(r"@\{([a-z_]+)\}")


def _fill(template: str, **values: object) -> str:
    """A file of ``rig/templates`` with each ``@{name}`` replaced by ``values[name]``.

    (Not ``$name``: the shell's own ``$`` stays as written.) A placeholder without a
    value is a KeyError.
    """
    text = (TEMPLATES / template).read_text()
    return _PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), text)


def _machine_shims(spec: HostSpec) -> dict[str, str]:
    """``uname -m`` and ``arch`` printing the host's simulated machine."""
    if spec.machine is None:
        return {}
    say = f"printf '%s\\n' {_sh_quote(spec.machine)}" if spec.machine else ":"
    return {
        cmd: _fill(f"{cmd}.sh", name=spec.name, say=say, real=_real(cmd))
        for cmd in ("uname", "arch")
    }


def _libc_shims(spec: HostSpec) -> dict[str, str]:
    """``ldd --version`` and ``getconf GNU_LIBC_VERSION`` of a musl or an older glibc."""
    if spec.libc == "musl":
        banner = (
            f"musl libc ({spec.uname_m or _real_machine()})\\nVersion {MUSL_VERSION}\\n"
            "Dynamic Program Loader\\nUsage: ldd [options] [--] pathname\\n"
        )
        return {
            "ldd": _fill(
                "ldd-musl.sh", name=spec.name, banner=_sh_quote(banner), real=_real("ldd")
            ),
            "getconf": _fill("getconf-musl.sh", name=spec.name, real=_real("getconf")),
        }
    if spec.glibc_version is None:
        return {}
    first = _sh_quote(f"ldd (GNU libc) {spec.glibc_version}")
    version = _sh_quote(f"glibc {spec.glibc_version}")
    return {
        "ldd": _fill(
            "ldd-glibc.sh", name=spec.name, first_line=first, real=_real("ldd"), tail=_real("tail")
        ),
        "getconf": _fill(
            "getconf-glibc.sh", name=spec.name, version=version, real=_real("getconf")
        ),
    }


def _emulation_shims(spec: HostSpec) -> dict[str, str]:
    """The aarch64-aware ``ldd`` of an emulated host."""
    if spec.emulate is None:
        return {}
    from rig.cross import AARCH64_LOADER, AARCH64_SYSROOT

    ldd = _fill(
        "ldd-aarch64.sh",
        name=spec.name,
        real=_real("ldd"),
        od=_real("od"),
        tr=_real("tr"),
        sysroot=AARCH64_SYSROOT,
        loader=AARCH64_LOADER,
    )
    return {"ldd": ldd}


def _shims(spec: HostSpec) -> dict[str, str]:
    """Command name -> shim script, for what the host simulates (nothing for a plain host)."""
    from rig.gpushims import gpu_shims

    return {
        **_machine_shims(spec),
        **_libc_shims(spec),
        **_emulation_shims(spec),
        **gpu_shims(spec.name, spec.gpus),
    }


def _session_emulation(spec: HostSpec) -> str:
    """The session wrapper's lines for an emulated CPU; binfmt must be ready for it."""
    if spec.emulate is None:
        return "# no CPU emulation"
    from rig.cross import AARCH64_SYSROOT, binfmt_problem

    problem = binfmt_problem()
    if problem is not None:
        raise RigError(
            f"host {spec.name!r} emulates aarch64, but aarch64 programs cannot run here "
            f"({problem}): run `python3 -m rig.cross ensure` (or scripts/setup)"
        )
    return (
        "# aarch64 programs run under qemu-user (binfmt); qemu finds their /lib here\n"
        f"QEMU_LD_PREFIX={AARCH64_SYSROOT}\nexport QEMU_LD_PREFIX"
    )


# --------------------------------------------------------------------------- the rig


class Rig:
    """A set of simulated ssh hosts whose state lives in ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()

    # ---- paths -------------------------------------------------------------------------

    @property
    def client_key(self) -> Path:
        """The client's private ed25519 key (``.pub`` next to it)."""
        return self.state_dir / "client" / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.state_dir / "authorized_keys"

    def host_dir(self, name: str) -> Path:
        return self.state_dir / "hosts" / name

    def data_path(self, name: str) -> Path:
        return self.host_dir(name) / "data"

    def host_key(self, name: str) -> Path:
        return self.host_dir(name) / "ssh_host_ed25519_key"

    def log_path(self, name: str) -> Path:
        """The host's sshd log (or hang-listener log)."""
        spec = self.spec(name)
        return self.host_dir(name) / ("hang.log" if spec.listen == "hang" else "sshd.log")

    def _pidfile(self, name: str) -> Path:
        return self.host_dir(name) / "listener.pid"

    def _config(self, name: str) -> Path:
        return self.host_dir(name) / "sshd_config"

    # ---- state -------------------------------------------------------------------------

    def hosts(self) -> dict[str, HostSpec]:
        """The hosts recorded in the state dir (empty if none)."""
        path = self.state_dir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        return {name: HostSpec.from_json(d) for name, d in raw["hosts"].items()}

    def spec(self, name: str) -> HostSpec:
        try:
            return self.hosts()[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in rig {self.state_dir}") from None

    def _save(self, hosts: dict[str, HostSpec]) -> None:
        payload = {"version": 1, "hosts": {n: s.to_json() for n, s in sorted(hosts.items())}}
        _write(self.state_dir / STATE_FILE, json.dumps(payload, indent=2) + "\n", 0o644)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ---- client-facing helpers ------------------------------------------------------------

    def ssh_entry(self, name: str) -> dict[str, object]:
        """The cluster.yaml ``ssh:`` mapping for that host."""
        spec = self.spec(name)
        return {
            "target": spec.address,
            "port": spec.port,
            "user": spec.user,
            "identity_file": str(self.client_key),
        }

    def ssh_argv(self, name: str, command: str, *, connect_timeout: int = 5) -> list[str]:
        """An OpenSSH client argv running ``command`` on that host (ignores ~/.ssh/config)."""
        spec = self.spec(name)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            f"ConnectTimeout={connect_timeout}",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            str(self.client_key),
            "-p",
            str(spec.port),
            "-l",
            spec.user,
            spec.address,
            "--",
            command,
        ]

    def host_public_key(self, name: str) -> str:
        """The host's current public key, ``ssh-ed25519 AAAA...`` (no comment)."""
        parts = (self.host_key(name).with_suffix(".pub")).read_text().split()
        return f"{parts[0]} {parts[1]}"

    def known_hosts_line(self, name: str) -> str:
        """A known_hosts line for the host's current key (``[addr]:port`` form)."""
        spec = self.spec(name)
        target = spec.address if spec.port == 22 else f"[{spec.address}]:{spec.port}"
        return f"{target} {self.host_public_key(name)}"

    def is_running(self, name: str) -> bool:
        spec = self.spec(name)
        return spec.listen == "none" or self._listener_pid(spec) is not None

    # ---- lifecycle -----------------------------------------------------------------------

    def up(self, hosts: Sequence[HostSpec]) -> None:
        """Bring ``hosts`` up (hosts from an earlier ``up`` stay as they are).

        A host already running with the same spec is left alone; a changed spec is
        stopped and restarted (keeping its host key).  Fails with :class:`RigError` if an
        address:port is taken.  On failure, hosts started by this call are stopped again.
        Returns once every sshd answers with its banner and every hang listener accepts.
        """
        self._check_new(hosts)
        started: list[HostSpec] = []
        with self._locked():
            state = self.hosts()
            _check_endpoints([*state.values(), *hosts])
            self._ensure_common(hosts)
            try:
                for spec in hosts:
                    old = state.get(spec.name)
                    if old == spec and self._listener_running(spec):
                        continue
                    if old is not None:
                        self._stop(old)
                    self._prepare(spec)
                    state[spec.name] = spec
                    self._save(state)
                    self._start(spec)
                    started.append(spec)
            except BaseException:
                for spec in started:
                    with contextlib.suppress(Exception):
                        self._stop(spec)
                raise

    def _check_new(self, hosts: Sequence[HostSpec]) -> None:
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate host names in {names}")
        if not _SAFE_PATH_RE.match(str(self.state_dir)):
            raise RigError(
                f"state dir {self.state_dir} has characters sshd_config cannot take "
                "(use letters, digits and ._+@:,=- only)"
            )

    def down(self) -> None:
        """Stop every process of the rig (safe twice, and from any process)."""
        if not self.state_dir.exists():
            self._stop_unrecorded_listeners()
            return
        with self._locked():
            errors = []
            for spec in self.hosts().values():
                try:
                    self._stop(spec)
                except RigError as exc:
                    errors.append(f"{spec.name}: {exc}")
            self._stop_unrecorded_listeners()
            for proc in _CHILDREN.pop(self.state_dir, []):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            if errors:
                raise RigError("down() left processes behind:\n" + "\n".join(errors))

    def _stop_unrecorded_listeners(self) -> None:
        """Listeners of this state dir that no pid file names (pid file or dir deleted)."""
        needle = f"{self.state_dir / 'hosts'}/"
        for process in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            ours = cmdline.startswith(("sshd: ", SSHD)) or _HANG_SCRIPT in cmdline
            if ours and needle in cmdline and process.pid != os.getpid() and _running(process):
                _kill_tree(process.pid, self.state_dir)

    def stop_host(self, name: str) -> None:
        """Stop that host's listener and sessions (the host "disappears")."""
        with self._locked():
            self._stop(self.spec(name))

    def start_host(self, name: str) -> None:
        """Start that host again, same key and config (no-op if it is running)."""
        with self._locked():
            spec = self.spec(name)
            if not self._listener_running(spec):
                self._start(spec)

    def rekey(self, name: str) -> None:
        """Give that host a new host key and restart its sshd."""
        with self._locked():
            spec = self.spec(name)
            if spec.listen != "sshd":
                raise RigError(f"host {name!r} has listen={spec.listen!r}: no sshd to rekey")
            self._stop(spec)
            key = self.host_key(name)
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            self._host_keygen(spec)
            self._start(spec)

    def __enter__(self) -> Rig:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    # ---- internals: one-off setup ----------------------------------------------------------

    def _ensure_common(self, hosts: Sequence[HostSpec]) -> None:
        _mkdir(self.state_dir)
        _mkdir(self.state_dir / "hosts")
        client_dir = _mkdir(self.state_dir / "client", 0o700)
        if not self.client_key.exists():
            _run(
                [
                    "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fdlrig-client",
                    "-f", str(self.client_key),
                ],
                "client key generation",
            )  # fmt: skip
        os.chmod(self.client_key, 0o600)
        pub = (client_dir / "id_ed25519.pub").read_text()
        _write(self.authorized_keys, pub, 0o644)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        if any(h.user == RIG_USER for h in hosts):
            self._ensure_user()
            for directory in [self.state_dir, *self.state_dir.parents]:
                mode = directory.stat().st_mode
                if not mode & stat.S_IXOTH:
                    os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)

    @staticmethod
    def _ensure_user() -> None:
        probe = subprocess.run(["getent", "passwd", RIG_USER], capture_output=True, check=False)
        if probe.returncode != 0:
            proc = subprocess.run(
                ["useradd", "--create-home", "--user-group", "--shell", RIG_USER_SHELL, RIG_USER],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode not in (0, 9):  # 9: created meanwhile by someone else
                raise RigError(f"useradd {RIG_USER} failed: {proc.stderr.strip()}")
        # "!" (useradd's default) means "locked" to sshd with UsePAM no, even for keys.
        _run(["usermod", "-p", "*", RIG_USER], f"unlocking {RIG_USER}")

    def _host_keygen(self, spec: HostSpec) -> None:
        key = self.host_key(spec.name)
        if not key.exists():
            _run(
                [
                    "ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                    "-C", f"fdlrig-host-{spec.name}", "-f", str(key),
                ],
                f"host key generation for {spec.name}",
            )  # fmt: skip
        os.chmod(key, 0o600)

    def _prepare(self, spec: HostSpec) -> None:
        hd = _mkdir(self.host_dir(spec.name))
        self._host_keygen(spec)
        path = self._install_shims(spec, hd)
        session = _fill(
            "session.sh",
            name=spec.name,
            path=_sh_quote(":".join(path)),
            marker=ENV_MARKER,
            host_dir=_sh_quote(str(hd)),
            emulation=_session_emulation(spec),
        )
        _write(hd / "session.sh", session, 0o755)
        self._prepare_data(spec)
        if spec.listen == "sshd":
            config = _fill(
                "sshd_config",
                name=spec.name,
                address=spec.address,
                port=spec.port,
                host_key=self.host_key(spec.name),
                pid_file=hd / "sshd.pid",
                authorized_keys=self.authorized_keys,
                rig_user=RIG_USER,
                force_command=hd / "session.sh",
                subsystem=f"Subsystem sftp {SFTP_SERVER}" if spec.sftp else "# no SFTP",
            )
            _write(self._config(spec.name), config, 0o644)

    @staticmethod
    def _install_shims(spec: HostSpec, hd: Path) -> list[str]:
        """The host's shims in ``bin`` (and ``sysbin`` without pkill); the session's PATH."""
        bindir = hd / "bin"
        shutil.rmtree(bindir, ignore_errors=True)
        _mkdir(bindir)
        for cmd, body in _shims(spec).items():
            _write(bindir / cmd, body, 0o755)
        sysbin = hd / "sysbin"
        shutil.rmtree(sysbin, ignore_errors=True)
        if spec.pkill:
            return [str(bindir), *SYSTEM_PATH]
        _mkdir(sysbin)
        seen_dirs: set[str] = set()
        for d in SYSTEM_PATH:
            real_dir = os.path.realpath(d)
            if real_dir in seen_dirs or not os.path.isdir(d):
                continue
            seen_dirs.add(real_dir)
            for entry in sorted(os.listdir(d)):
                link = sysbin / entry
                if entry == "pkill" or link.exists() or link.is_symlink():
                    continue
                link.symlink_to(os.path.join(d, entry))
        return [str(bindir), str(sysbin)]

    def _prepare_data(self, spec: HostSpec) -> None:
        data = self.data_path(spec.name)
        if spec.data == "missing":
            shutil.rmtree(data, ignore_errors=True)
        else:
            data.mkdir(exist_ok=True)
            os.chown(data, 0, 0)
            os.chmod(data, 0o755 if spec.data == "ok" else 0o700)

    # ---- internals: processes ----------------------------------------------------------

    def _listener_pid(self, spec: HostSpec) -> int | None:
        """The pid of the host's live listener, if the pid file names one that is ours."""
        try:
            pid = int(self._pidfile(spec.name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if _alive(pid) and str(self.host_dir(spec.name)) in _cmdline(pid):
            return pid
        return None

    def _listener_running(self, spec: HostSpec) -> bool:
        if spec.listen == "none":
            return True
        return self._listener_pid(spec) is not None

    def _start(self, spec: HostSpec) -> None:
        hd = self.host_dir(spec.name)
        _port_free(spec)
        if spec.listen == "none":
            return
        if spec.listen == "sshd":
            config = str(self._config(spec.name))
            check = subprocess.run(
                [SSHD, "-t", "-f", config], capture_output=True, text=True, check=False
            )
            if check.returncode != 0:
                raise RigError(
                    f"host {spec.name!r}: `sshd -t -f {config}` rejected the config:\n"
                    f"{check.stderr.strip()}"
                )
            log = hd / "sshd.log"
            argv = [sys.executable, "-c", _SUBREAPER_EXEC, SSHD, "-D", "-f", config, "-E", str(log)]
        else:
            log = hd / "hang.log"
            argv = [sys.executable, "-c", _HANG_SCRIPT, spec.address, str(spec.port), str(hd)]
        with open(log, "ab") as logfh:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logfh,
                stderr=logfh,
                start_new_session=True,
                close_fds=True,
            )
        _CHILDREN.setdefault(self.state_dir, []).append(proc)
        _write(self._pidfile(spec.name), f"{proc.pid}\n", 0o644)
        self._await_listening(spec, proc, log)

    def _await_listening(self, spec: HostSpec, proc: subprocess.Popen[bytes], log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last = "not tried"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._pidfile(spec.name).unlink(missing_ok=True)
                raise RigError(
                    f"host {spec.name!r}: {spec.listen} listener exited with {proc.returncode} "
                    f"before listening on {spec.address}:{spec.port}; log {log}:\n"
                    + (log_tail(log, 15) or "(no log)")
                )
            try:
                with socket.create_connection((spec.address, spec.port), timeout=1.0) as sock:
                    if spec.listen == "hang":
                        return
                    banner = sock.recv(256)
                    if banner.startswith(b"SSH-"):
                        return
                    last = f"unexpected banner {banner!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.02)
        self._stop(spec)
        raise RigError(
            f"host {spec.name!r}: {spec.listen} on {spec.address}:{spec.port} not ready after "
            f"{START_TIMEOUT}s ({last}); log {log}:\n" + (log_tail(log, 15) or "(no log)")
        )

    def _stop(self, spec: HostSpec) -> None:
        hd = self.host_dir(spec.name)
        pid = self._listener_pid(spec)
        if pid is not None:
            _kill_tree(pid, self.state_dir)
        # Sessions that escaped the tree (double-forked remote commands).
        strays = _marked_pids(hd)
        for stray in strays:
            _signal(stray, signal.SIGTERM)
        left = _wait_gone(strays, STOP_TIMEOUT, self.state_dir)
        for stray in left:
            _signal(stray, signal.SIGKILL)
        left = _wait_gone(left, STOP_TIMEOUT, self.state_dir)
        _reap_registered(self.state_dir)
        self._pidfile(spec.name).unlink(missing_ok=True)
        (hd / "sshd.pid").unlink(missing_ok=True)
        if left:
            raise RigError(f"host {spec.name!r}: processes {left} survived SIGKILL")


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rig.sshrig", description="Manage an ssh rig by its state dir."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("down", help="stop every process of the rig").add_argument(
        "state_dir", type=Path
    )
    sub.add_parser("status", help="list the rig's hosts").add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    rig = Rig(args.state_dir)
    if args.cmd == "down":
        try:
            rig.down()
        except RigError as exc:
            print(f"rig down: {exc}", file=sys.stderr)
            return 1
        return 0
    for name, spec in rig.hosts().items():
        state = "up" if rig.is_running(name) else "down"
        print(f"{name}\t{spec.address}:{spec.port}\t{spec.listen}\t{spec.user}\t{state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
