"""A fleet of simulated hosts for scale tests: hundreds of loopback addresses, real sshd.

OpenSSH's sshd listens on at most 16 addresses, so host ``i`` is served by
daemon ``i // 16``; every daemon shares one host key and one authorised client
key and raises ``MaxStartups`` so that a whole fleet connecting at once is
never throttled by sshd itself (the point is to measure the controller). Host
``i`` is ``node-NNNN`` at ``127.0.(B + i // 250).(1 + i % 250)`` on one port.

Unlike :mod:`rig.sshrig` (one daemon per host, per-host shims), every host
here is the same plain machine: this rig is for counting, not for verdicts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"
PER_DAEMON = 16
DAEMON_OPTIONS = (
    "StrictModes no",
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "PermitRootLogin prohibit-password",
    "UsePAM no",
    "UseDNS no",
    "PrintMotd no",
    "PrintLastLog no",
    "X11Forwarding no",
    "SetEnv SHLVL=1",  # bash then skips ~/.bashrc, as in rig.sshrig
    "MaxStartups 1000:30:1000",
    "MaxSessions 64",
    "LoginGraceTime 120",
    "LogLevel ERROR",
    "Subsystem sftp /usr/lib/openssh/sftp-server",  # copy delivery's uploads (bench.copy)
)


class FleetRig:
    """``up(n)`` starts the daemons for ``n`` hosts; ``down()`` stops them (any process)."""

    def __init__(self, state: Path, port: int = 2300, net: str = "127.0.1") -> None:
        self.state, self.port, self.net = Path(state), port, net
        self.client_key = self.state / "id_ed25519"
        self.data = self.state / "data"

    def address(self, index: int) -> str:
        a, b, c = (int(x) for x in self.net.split("."))
        return f"{a}.{b}.{c + index // 250}.{1 + index % 250}"

    def up(self, count: int, timeout: float = 30) -> None:
        """Start ``ceil(count / 16)`` daemons and wait until every address accepts."""
        self.down()
        self._prepare()
        addresses = [self.address(i) for i in range(count)]
        pids = [
            self._start_daemon(n // PER_DAEMON, addresses[n : n + PER_DAEMON])
            for n in range(0, count, PER_DAEMON)
        ]
        (self.state / "sshd.pids").write_text("".join(f"{pid}\n" for pid in pids))
        self._wait_listening(addresses, timeout)

    def _prepare(self) -> None:
        for directory in (self.state, self.data, self.state / "sshd"):
            directory.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for key in (self.state / "host_key", self.client_key):
            if not key.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
                )
        shutil.copy(f"{self.client_key}.pub", self.state / "authorized_keys")

    def _start_daemon(self, number: int, addresses: list[str]) -> int:
        base = self.state / "sshd" / f"sshd_{number:03d}"
        lines = [f"ListenAddress {address}:{self.port}" for address in addresses]
        lines += [
            f"HostKey {self.state / 'host_key'}",
            f"PidFile {base}.pid",
            f"AuthorizedKeysFile {self.state / 'authorized_keys'}",
            *DAEMON_OPTIONS,
        ]
        Path(f"{base}.conf").write_text("\n".join(lines) + "\n")
        process = subprocess.Popen(
            [SSHD, "-D", "-f", f"{base}.conf", "-E", f"{base}.log"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return process.pid

    def _wait_listening(self, addresses: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(addresses)
        while pending:
            pending = [a for a in pending if not _accepts(a, self.port)]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"fleet rig: {len(pending)} address(es) not listening")
            time.sleep(0.2 if pending else 0)

    def workers(self, count: int, path: str) -> list[dict[str, Any]]:
        """cluster.yaml worker entries for the first ``count`` hosts."""
        return [
            {
                "host": f"node-{i:04d}",
                "path": path,
                "data_path": str(self.data),
                "ssh": {
                    "target": self.address(i),
                    "port": self.port,
                    "user": "root",
                    "identity_file": str(self.client_key),
                },
            }
            for i in range(count)
        ]

    def server_cpu(self) -> float:
        """CPU seconds the daemons and every process they reaped have spent so far
        (utime, stime, cutime, cstime): every host's sessions, nothing else on the machine."""
        ticks = 0
        for pid in (self.state / "sshd.pids").read_text().split():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])
        return ticks / os.sysconf("SC_CLK_TCK")

    def down(self) -> None:
        """Stop every daemon and its sessions (each runs in its own session)."""
        pids = self.state / "sshd.pids"
        if not pids.is_file():
            return
        for line in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(line), signal.SIGTERM)
        pids.unlink()


def _accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True
