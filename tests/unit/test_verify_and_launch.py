"""Pure pieces of verification, launch and ssh options, run against real local files."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fdl_tasks.config.model import SshSettings, Worker
from fdl_tasks.config.names import split_ssh_option
from fdl_tasks.config.settings import Settings
from fdl_tasks.core.binary_files import BinaryFacts, binary_facts, file_sha256, required_glibc
from fdl_tasks.core.errors import FdlError
from fdl_tasks.launch import check_envelopes, launch_line
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.verification import copy_problems, parse_verification, verification_script
from fdl_tasks.publish.verification_io import FirstAsks, verify_copies
from fdl_tasks.ssh.outcomes import Outcome, Reply
from fdl_tasks.ssh.sshconfig import ssh_config_block
from tests.unit.meeting_shims import meeting_shims, met


def test_required_glibc_reads_a_real_elf() -> None:
    needed = required_glibc(Path("/bin/ls"))
    assert needed is not None and (2, 2) <= needed <= (2, 99)


def test_required_glibc_rejects_a_non_elf(tmp_path: Path) -> None:
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    with pytest.raises(FdlError, match="cannot read the ELF file"):
        required_glibc(text)


def verified_here(root: Path, entry: PerHostEnvelope, env: dict[str, str] | None = None) -> str:
    """The verification script's answer, run on this machine as a host's shell would."""
    script = verification_script(str(root), entry)
    return subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout


def test_verification_script_against_this_machine(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "tool with space"
    binary.write_bytes(Path("/bin/true").read_bytes())
    binary.chmod(0o755)
    entry = PerHostEnvelope("bin/tool with space", "/nonexistent/lib")
    copy = parse_verification(verified_here(tmp_path, entry))
    assert copy is not None
    assert copy.sha256 == file_sha256(binary)
    assert copy.missing_libraries == ()
    assert copy.glibc is not None
    assert copy_problems("h", str(binary), copy, file_sha256(binary), (2, 2)) == []
    assert "differs" in copy_problems("h", "p", copy, "0" * 64, None)[0]
    assert "needs glibc 9.9" in copy_problems("h", "p", copy, copy.sha256 or "", (9, 9))[0]
    missing = PerHostEnvelope("bin/none", "/l")
    gone = parse_verification(verified_here(tmp_path, missing))
    assert gone is not None and gone.sha256 is None
    assert "does not exist" in copy_problems("h", "p", gone, "x", None)[0]


def test_verification_hashes_while_ldd_reads_and_keeps_every_line_whole(tmp_path: Path) -> None:
    """The hash and ``ldd`` run side by side (:mod:`tests.unit.meeting_shims`), and
    ``ldd``'s lines, here 200 of them (more than a pipe writes at once), come out whole
    beside the hash's."""
    shims, meet = tmp_path / "shims", tmp_path / "meet"
    shims.mkdir()
    meet.mkdir()
    missing = "".join(f"\tlibgone{n}.so => not found\n" for n in range(200))
    tools = {
        "sha256sum": ("ldd", 'exec /usr/bin/sha256sum "$@"'),
        "ldd": ("sha256sum", f"printf '%s' {shlex.quote(missing)}"),
    }
    meeting_shims(shims, meet, tools)
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "tool"
    binary.write_bytes(Path("/bin/true").read_bytes())
    entry = PerHostEnvelope("bin/tool", "/nonexistent/lib")
    answer = verified_here(tmp_path, entry, {"PATH": f"{shims}:/usr/bin:/bin", "MEET": str(meet)})
    assert met(meet, "sha256sum", "ldd")
    copy = parse_verification(answer)
    assert copy is not None
    assert copy.sha256 == file_sha256(binary)
    assert copy.binary_cpu_arch == os.uname().machine
    assert copy.missing_libraries == tuple(f"libgone{n}.so" for n in range(200))
    assert copy.glibc is not None


WORKER = Worker("b", "/mnt/p", "precompiled/cu128", env={"NCCL_DEBUG": "WARN", "X": "w"})


class ThisMachine:
    """A fleet of one host, this machine, asked with ``sh -c``: the scripts run for real."""

    def __init__(self, path: Path) -> None:
        self.workers = {"h": Worker("h", str(path))}

    def run(self, scripts: dict[str, str], timeout: float | None) -> dict[str, Outcome]:
        done = {
            h: subprocess.run(["sh", "-c", s], capture_output=True, text=True)
            for h, s in scripts.items()
        }
        return {h: Reply(d.stdout, d.stderr, d.returncode) for h, d in done.items()}


def test_verification_takes_what_the_build_record_read_of_the_binary(tmp_path: Path) -> None:
    """The binary's digest and glibc need, as its build record has them: the controller's
    file is not read again (here it is not even there); else it is read."""
    (tmp_path / "bin").mkdir()
    copy = tmp_path / "bin" / "tool"
    copy.write_bytes(Path("/bin/true").read_bytes())
    copy.chmod(0o755)
    envelopes = {"h": PerHostEnvelope("bin/tool", "/nonexistent/lib")}
    built = {"h": tmp_path / "gone" / "tool"}
    fleet, settings = ThisMachine(tmp_path), Settings.from_config({"verify_retries": 0})
    said: list[str] = []
    known = {built["h"]: binary_facts(copy)}
    found = verify_copies(fleet, envelopes, built, settings, said.append, known)  # type: ignore[arg-type]
    assert (found.verified, found.problems) == (("h",), ())
    other = {built["h"]: BinaryFacts("0" * 64, None)}
    found = verify_copies(fleet, envelopes, built, settings, said.append, other)  # type: ignore[arg-type]
    assert "differs from the controller's build" in found.problems[0]
    with pytest.raises(FileNotFoundError):
        verify_copies(fleet, envelopes, built, settings, said.append)  # type: ignore[arg-type]


class Asked(ThisMachine):
    """This machine as two hosts, each asked once at most; what was asked, in order."""

    def __init__(self, path: Path) -> None:
        self.workers = {h: Worker(h, str(path)) for h in ("h1", "h2", "copied")}
        self.settings = Settings.from_config({"verify_retries": 0})
        self.rounds: list[tuple[str, float, float, bool]] = []
        self.asked: list[str] = []

    def run(self, scripts: dict[str, str], timeout: float | None) -> dict[str, Outcome]:
        assert not set(scripts) & set(self.asked), scripts
        self.asked += sorted(scripts)
        return super().run(scripts, timeout)


def test_a_host_is_asked_as_its_build_ends_and_not_again(tmp_path: Path) -> None:
    """:class:`FirstAsks` asks a build's hosts as it ends (only those it was given: a copy
    host is asked after its upload); verification then asks only the others."""
    (tmp_path / "bin").mkdir()
    copy = tmp_path / "bin" / "tool"
    copy.write_bytes(Path("/bin/true").read_bytes())
    envelopes = {h: PerHostEnvelope("bin/tool", "/nonexistent/lib") for h in ("h1", "h2", "copied")}
    built = dict.fromkeys(envelopes, copy)
    fleet = Asked(tmp_path)
    with FirstAsks(fleet, envelopes, {"h1", "h2"}) as first:  # type: ignore[arg-type]
        first.built(SimpleNamespace(job=SimpleNamespace(hosts=("h1", "copied"))))  # type: ignore[arg-type]
        answered = first.answers()
    assert fleet.asked == ["h1"] and set(answered) == {"h1"}
    said: list[str] = []
    found = verify_copies(fleet, envelopes, built, fleet.settings, said.append, None, answered)  # type: ignore[arg-type]
    assert fleet.asked == ["h1", "copied", "h2"]
    assert (found.verified, said) == (("copied", "h1", "h2"), [])


def test_launch_command_orders_env_and_quotes() -> None:
    entry = PerHostEnvelope(
        "target/x/release/bench", "/mnt/p/libtorch/precompiled/cu128/lib", "ddp-bench"
    )
    lines = launch_line(WORKER, entry, {"X": "cluster", "Y": "c"}, ["--a", "b c"]).splitlines()
    assert lines[0] == "cd /mnt/p/ddp-bench || exit 1"
    assert shlex.split(lines[1]) == [
        "export",
        "X=w",
        "Y=c",
        "NCCL_DEBUG=WARN",
        "LD_LIBRARY_PATH=/mnt/p/libtorch/precompiled/cu128/lib",
    ]
    assert "/mnt/p/target/x/release/bench --a 'b c' &" in lines


def test_worker_library_path_is_used_as_given() -> None:
    """flodl's rule: an explicit LD_LIBRARY_PATH in a worker's or the cluster's env wins."""
    worker = Worker("b", "/p", env={"LD_LIBRARY_PATH": "/usr/local/lib"})
    command = launch_line(worker, PerHostEnvelope("bin", "/p/lib"), {}, [])
    assert "export LD_LIBRARY_PATH=/usr/local/lib\n" in command and "/p/lib" not in command
    from_cluster = launch_line(
        Worker("b", "/p"), PerHostEnvelope("bin", "/p/lib"), {"LD_LIBRARY_PATH": "/c"}, []
    )
    assert "export LD_LIBRARY_PATH=/c\n" in from_cluster


def test_check_envelopes() -> None:
    entry = PerHostEnvelope("target/cluster/b/x/release/bench", "/l")
    assert check_envelopes({"b": entry}, [WORKER], "bench", "f") == []
    assert check_envelopes({}, [WORKER], "bench", "f") == ["b has no entry in f"]
    assert "not 'other'" in check_envelopes({"b": entry}, [WORKER], "other", "f")[0]


def test_ssh_options_become_a_config_block() -> None:
    assert split_ssh_option("ProxyJump=bastion") == ("proxyjump", "bastion")
    assert split_ssh_option("ConnectTimeout 3") == ("connecttimeout", "3")
    assert split_ssh_option("ProxyJump = =b") == ("proxyjump", "=b")
    assert split_ssh_option("ProxyCommand ssh -o A=b x") == ("proxycommand", "ssh -o A=b x")
    assert split_ssh_option("ProxyJump =") is None and split_ssh_option("ProxyJump") is None
    worker = Worker(
        "b",
        "/p",
        ssh=SshSettings(
            identity_file="~/.ssh/k",
            options=("ProxyJump=j", "ServerAliveInterval=5", "Compression yes"),
        ),
    )
    block, ignored = ssh_config_block(worker)
    assert block.splitlines() == ["Host *", "    identityfile = ~/.ssh/k", "    proxyjump = j"]
    assert ignored == ["ServerAliveInterval", "Compression"]


def test_settings_are_checked_at_the_edge() -> None:
    settings = Settings.from_config({"build_jobs": "3", "verify": "no"}, probe_timeout="2.5")
    assert settings.build_jobs == 3 and settings.verify is False and settings.probe_timeout == 2.5
    assert Settings.from_config({}, build_jobs=None).build_jobs == 0
    cases: list[tuple[dict[str, object], str]] = [
        ({"connect_timeout": 0}, "positive"),
        ({"bogus": 1}, "unknown fdl"),
        ({"build_jobs": "many"}, "must be int"),
        ({"verify": "maybe"}, "must be bool"),
    ]
    for bad, fragment in cases:
        with pytest.raises(FdlError, match=fragment):
            Settings.from_config(bad)
