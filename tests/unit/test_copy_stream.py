"""Copy delivery to a host that refuses SFTP: the exec channel's script, in a real shell,
its answers as lines, and a host refusing both channels."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import paramiko

from fdl_tasks.config.settings import Settings
from fdl_tasks.publish.delivery import HostState, Target, stream_problem, stream_script
from fdl_tasks.publish.delivery_io import deliver
from fdl_tasks.ssh.answers import BEGIN, END
from fdl_tasks.ssh.outcomes import Reply

STATE = HostState(mkdir="ok", writable=True, sha256=None, free_bytes=10**9)
DATA = b"\x7fELF" + bytes(range(256)) * 64


def target(tmp_path: Path, data: bytes = DATA) -> Target:
    source = tmp_path / "built"
    source.write_bytes(data)
    final = tmp_path / "run dir/bin/ddp bench"
    return Target(
        host="b",
        source=source,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        final=str(final),
        workdir=str(tmp_path / "run dir"),
    )


def receive(t: Target, data: bytes, stale: list[str]) -> subprocess.CompletedProcess[str]:
    script = stream_script(t, t.part("new"), stale)
    return subprocess.run(["sh", "-c", script], input=data.decode("latin-1"), **_text())


def _text() -> dict[str, Any]:
    return {"capture_output": True, "text": True, "encoding": "latin-1", "check": False}


def test_whole_bytes_land_executable_at_the_final_path(tmp_path: Path) -> None:
    t = target(tmp_path)
    Path(t.final).parent.mkdir(parents=True)
    stale = Path(t.part("dead"))
    stale.write_bytes(b"half")
    done = receive(t, DATA, [str(stale)])
    assert stream_problem(t, STATE, done.returncode, done.stdout, done.stderr) is None
    assert Path(t.final).read_bytes() == DATA
    assert Path(t.final).stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in Path(t.final).parent.iterdir()) == ["ddp bench"]


def test_short_input_is_removed_and_the_old_file_stays(tmp_path: Path) -> None:
    """A stopped or dropped sender: the host's checks refuse the part."""
    t = target(tmp_path)
    Path(t.final).parent.mkdir(parents=True)
    Path(t.final).write_bytes(b"old")
    done = receive(t, DATA[:-1], [])
    assert done.returncode == 3
    problem = stream_problem(t, STATE, done.returncode, done.stdout, done.stderr)
    assert problem is not None
    assert problem.startswith(f"b: writing {t.final} failed ({len(DATA) - 1} bytes arrived")
    assert problem.endswith(f"the binary needs {len(DATA)} bytes (0.0 MB), 1000.0 MB free before")
    assert sorted(p.name for p in Path(t.final).parent.iterdir()) == ["ddp bench"]
    assert Path(t.final).read_bytes() == b"old"


def test_a_write_that_fails_names_the_path_and_the_shell_error(tmp_path: Path) -> None:
    t = target(tmp_path)  # its directory does not exist
    done = receive(t, DATA, [])
    problem = stream_problem(t, STATE, done.returncode, done.stdout, done.stderr)
    assert problem is not None and problem.startswith(f"b: writing {t.final} failed (")
    assert "Directory nonexistent" in problem or "No such file" in problem, problem


def test_no_answer_from_the_script_names_both_channels() -> None:
    t = Target(host="b", source=Path("/x"), sha256="0" * 64, size=1, final="/f", workdir="/")
    problem = stream_problem(t, STATE, 1, "", "This account is restricted.\n")
    assert problem == (
        "b: the host refuses SFTP, and the ssh exec channel failed too "
        "(exit 1: This account is restricted.): the binary could not be sent"
    )


class _Channel:
    """An SFTP channel whose subsystem request the server refuses, as paramiko says it."""

    def settimeout(self, timeout: float) -> None:
        pass

    def invoke_subsystem(self, name: str) -> None:
        raise paramiko.SSHException("Channel closed.")

    def close(self) -> None:
        pass


class _Transport:
    """A live connection that refuses the SFTP subsystem, then the exec channel."""

    def __init__(self) -> None:
        self.sessions = 0

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> _Channel:
        self.sessions += 1
        if self.sessions > 1:
            raise paramiko.ChannelException(1, "Administratively prohibited")
        return _Channel()


class _Fleet:
    def __init__(self) -> None:
        transport = _Transport()
        client = type("Client", (), {"get_transport": lambda self: transport})()
        self.connections = {"b": type("Conn", (), {"is_connected": True, "client": client})()}

    def run(self, scripts: dict[str, str], timeout: float) -> dict[str, Reply]:
        answer = f"{BEGIN}\nmkdir=ok\nwritable=yes\nsha256=missing\nfree_kib=1000\n{END}\n"
        return {host: Reply(answer, "", 0) for host in scripts}


def test_a_host_refusing_sftp_and_exec_gets_one_line_naming_both(tmp_path: Path) -> None:
    lines: list[str] = []
    copies = deliver(_Fleet(), [target(tmp_path)], Settings(), lines.append)  # type: ignore[arg-type]
    assert copies.sent == {}
    assert copies.problems == (
        "b: the host refuses SFTP, and the ssh exec channel failed too "
        "(Administratively prohibited): the binary could not be sent",
    )
    assert not any("retrying" in line for line in lines), lines
