"""What a person watches, through the real ``inv``: a live line per build on a terminal
(tmux), each diagnostic once, and piped output with no escape codes.

The project is :mod:`bench.flodl_crate` with 40 crates (37 generated ones,
torch-sys, tch and the binary's package), built for three variants natively (and
once with ``docker run``: cargo's bar comes through a container too).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import flodl_crate
from rig.harness import RigCluster, inv_argv, prebuild_args, start_rig
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("console-a", "127.0.0.43"),
    HostSpec("console-b", "127.0.0.44"),
    HostSpec("console-c", "127.0.0.45"),
]
ARCHS = {
    "console-a": "precompiled/cu128",
    "console-b": "precompiled/cu126",
    "console-c": "precompiled/cpu",
}
ABI = {"precompiled/cu128": 2071, "precompiled/cu126": 2082, "precompiled/cpu": 2090}
#: 37 ordinary crates, torch-sys, tch and ddp-bench: 40 crates.
SIZE = flodl_crate.Size(deps=37, modules=1, funcs=1, kinds=1)
LABELS = {"console-a": "cu128", "console-b": "cu126", "console-c": "cpu"}
#: What a terminal shows: rich's codes (colours, cursor moves) and carriage returns.
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("console"), HOSTS, docker=True) as cluster:
        flodl_crate.generate(cluster.project, SIZE)
        flodl_crate.layout_variants(cluster.project, ABI)
        yield cluster


@pytest.fixture
def cluster_file(rig: RigCluster) -> Iterator[Path]:
    """A cold start, and the binary's source as generated afterwards."""
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    main = rig.project / flodl_crate.COMMAND / "src" / "main.rs"
    source = main.read_text()
    yield rig.write([rig.worker(h, arch=a) for h, a in ARCHS.items()], "console.yaml")
    main.write_text(source)


class Tmux:
    """A private tmux server (its own socket) with one 160x40 window running a command."""

    def __init__(self, root: Path, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"fdl-console-{time.monotonic_ns()}"
        self.raw = root / f"{self.socket}.raw"
        line = f"{shlex.join(command)}; echo fdl-exit=$?; sleep 600"
        self.tmux("new-session", "-d", "-x", "160", "-y", "40", line, env=env)
        self.tmux("pipe-pane", "-o", f"cat >> {shlex.quote(str(self.raw))}")

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, env=env
        )
        return done.stdout

    def screen(self, history: bool = False) -> list[str]:
        lines = self.tmux("capture-pane", "-p", *(["-S", "-"] if history else [])).splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        return lines

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def watched(
    rig: RigCluster, path: Path, *options: str, timeout: float = 600
) -> tuple[list[str], str, int]:
    """``inv prebuild`` on a terminal: the screen left (history included), the raw bytes
    written to it, and the most live build lines seen on one screen."""
    env = rig.environment({"TERM": "xterm-256color"})
    argv = ["env", "-C", str(rig.root), *inv_argv(*prebuild_args(path, *options))]
    terminal = Tmux(rig.root, argv, env)
    most = 0
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = terminal.screen()
            most = max(most, sum("━" in line for line in screen))
            if any(line.startswith("fdl-exit=") for line in screen):
                break
            time.sleep(0.2)
        else:
            pytest.fail("inv prebuild did not end in time:\n" + "\n".join(terminal.screen()))
        left = terminal.screen(history=True)
        raw = terminal.raw.read_bytes().decode(errors="replace")
    finally:
        terminal.close()
    return left, raw, most


def test_a_cold_prebuild_of_three_variants_on_a_terminal(
    rig: RigCluster, cluster_file: Path
) -> None:
    """One live line per running build, bars reaching M/M, at most 15 lines left.

    A preflight runs first: a first run's own lines (host keys accepted, notes said
    once per cluster file) are not the build's.
    """
    assert rig.inv("preflight", "--cluster-file", str(cluster_file)).returncode == 0
    left, raw, most = watched(rig, cluster_file)
    assert left[-1] == "fdl-exit=0", "\n".join(left)
    screen = left[:-1]
    assert 1 <= most <= 3, most
    assert not [line for line in screen if "━" in line]  # the live region is gone
    assert len(screen) <= 15, "\n".join(screen)
    assert not [line for line in screen if "Compiling" in line]
    text = ESCAPES.sub("", raw)
    for host, label in LABELS.items():
        bars = re.findall(rf"{label} \({host}\)[^\r\n]*?\s(\d+)/(\d+)\s", text)
        assert bars, (label, text[-2000:])
        assert any(done == total for done, total in bars), (label, bars[-3:])
        assert f"prebuild: {label} ({host}) ok in " in "\n".join(screen)


def test_plain_on_a_terminal_writes_no_escape_code(rig: RigCluster, cluster_file: Path) -> None:
    left, raw, most = watched(rig, cluster_file, "--plain")
    assert left[-1] == "fdl-exit=0", "\n".join(left)
    assert most == 0 and "\x1b" not in raw and "━" not in raw
    assert "prebuild: cu128 (console-a) started" in left


def break_main(rig: RigCluster, line: str) -> None:
    main = rig.project / flodl_crate.COMMAND / "src" / "main.rs"
    main.write_text(main.read_text() + "\n" + line + "\n")


def test_a_shared_error_is_said_once_naming_the_three_builds(
    rig: RigCluster, cluster_file: Path
) -> None:
    break_main(rig, 'fn broken() -> u32 { "not a number" }')
    done = rig.inv(*prebuild_args(cluster_file), timeout=600)
    assert done.returncode == 1, done.stderr
    assert not ESCAPES.search(done.stderr) and "\r" not in done.stderr  # piped: plain
    said = [line for line in done.stderr.splitlines() if line.startswith("error[E0308]")]
    assert said == ["error[E0308] in cu128, cu126, cpu: mismatched types"], done.stderr
    assert done.stderr.count("expected `u32`, found `&str`") == 1, done.stderr
    assert "3 of 3 build(s) failed" in done.stderr
    assert done.stderr.count("  log:        ") == 3  # each build's log named, not repeated
    assert "last lines of the log" not in done.stderr


def test_a_variant_only_error_is_said_once_for_that_variant(
    rig: RigCluster, cluster_file: Path
) -> None:
    break_main(rig, '#[cfg(not(feature = "cuda"))]\nfn broken() -> u32 { "cpu only" }')
    done = rig.inv(*prebuild_args(cluster_file), timeout=600)
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("error[E0308]")]
    assert said == ["error[E0308] in cpu: mismatched types"], done.stderr
    assert "1 of 3 build(s) failed" in done.stderr
    assert "prebuild: cu128 (console-a) ok in " in done.stderr


def test_cargos_bar_comes_through_docker_run(rig: RigCluster) -> None:
    """The progress flags are on cargo's command line: in a container too, piped."""
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    workers = [rig.worker(h, arch=a) for h, a in ARCHS.items()]
    path = rig.write(workers, "docker.yaml", docker=rig.docker_settings())
    # cold, without the compile cache: builds long enough for a progress line every 5 s
    done = rig.inv(*prebuild_args(path), "--no-cache", timeout=900)
    assert done.returncode == 0, done.stderr
    assert not ESCAPES.search(done.stderr) and "\r" not in done.stderr
    progress = re.findall(r"^(cu128|cu126|cpu): (\d+)/(\d+) units, \d+ s", done.stderr, re.M)
    assert progress, done.stderr
    assert all(int(count) <= int(total) for _, count, total in progress)
