"""The README's quick start, followed literally against the demo rig.

The files (``tasks.py``, ``invoke.yaml``, ``cluster.yaml``) and the
commands of its "First run" block are taken from README.md itself, so this
test fails when the README changes wrongly. The rig is the demo's
(:mod:`rig.demo`: the same project, hosts, paths and client key path as
``scripts/demo --keep``), brought up at this module's addresses
(127.0.6.40-44) in a mount namespace of the test's own where ``/var/tmp`` is
a directory of the test, so the README's paths under ``/var/tmp/fdl-demo``
are the test's and a real demo on this machine is never touched. The only
edit to the README's files is the host addresses. The hosts are real sshd,
the builds real native cargo; GPUs and the aarch64 box are simulated by the
rig's shims (node-gh200, the aarch64 box, is left out: its stub is compiled in a
container, which would not see the namespace's files). ``HOME`` is a directory of
the test, so the host keys ``accept-new`` records never reach the machine's
own ``~/.ssh/known_hosts``; the install step is the suite's own venv.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rig import demo
from rig.harness import RIG_BUDGETS, inv_argv, isolated_env

pytestmark = pytest.mark.rig

README = Path(__file__).resolve().parents[2] / "README.md"
FIRST = "127.0.6.40"
FILES = ("tasks.py", "invoke.yaml", "cluster.yaml")


def quick_start() -> tuple[dict[str, str], list[list[str]]]:
    """The quick start's files (by the name each block's first comment gives) and the
    ``inv`` command lines of its blocks, in order."""
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for block in re.findall(r"^```\w*\n(.*?)^```", section, re.M | re.S):
        first = block.splitlines()[0]
        name = re.match(r"# (\S+?):?(\s|$)", first)
        if name and name.group(1) in FILES:
            files[name.group(1)] = block
        commands += [shlex.split(line, comments=True) for line in block.splitlines()]
    commands = [words for words in commands if words[:1] == ["inv"]]
    return files, commands


class Namespace:
    """A process holding a private mount namespace, ``/var/tmp`` bound to ``root`` there."""

    def __init__(self, root: Path) -> None:
        script = f"mount --bind {shlex.quote(str(root))} /var/tmp && echo up && exec sleep 86400"
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None and self.holder.stdout.readline() == "up\n"

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        # nsenter's own --wd would resolve the directory outside the namespace
        enter = [
            "nsenter",
            f"--mount=/proc/{self.holder.pid}/ns/mnt",
            "--",
            "env",
            f"--chdir={cwd}",
        ]
        return subprocess.run(
            [*enter, *argv], env=env, text=True, capture_output=True, timeout=timeout, check=False
        )

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def demo_rig(tmp_path: Path) -> Iterator[tuple[Namespace, dict[str, str]]]:
    """The demo rig at this module's addresses; also the environment of the user's shell."""
    (tmp_path / "var-tmp").mkdir()
    (tmp_path / "home").mkdir()
    space = Namespace(tmp_path / "var-tmp")
    state = str(demo.DEMO / "rig-quickstart")  # never the demo's own: its `down` is by path
    rig_cmd = [sys.executable, "-m", "rig.demo"]
    env = isolated_env({"PYTHONPATH": str(README.parent)})
    for tool in ("RUSTUP_HOME", "CARGO_HOME"):  # HOME moves; the toolchain stays where it is
        default = Path.home() / f".{tool.split('_')[0].lower()}"
        env.setdefault(tool, str(default))
    try:
        brought = space.run(
            [*rig_cmd, "up", "--state", state, "--first-address", FIRST, "--no-aarch64"],
            Path("/"),
            env,
            300,
        )
        assert brought.returncode == 0, brought.stdout + brought.stderr
        yield space, {**env, "HOME": str(tmp_path / "home"), **RIG_BUDGETS}
    finally:
        space.run([*rig_cmd, "down", "--state", state], Path("/"), env, 120)
        space.close()


def test_the_quick_start_as_printed(
    demo_rig: tuple[Namespace, dict[str, str]], tmp_path: Path
) -> None:
    space, env = demo_rig
    var_tmp = tmp_path / "var-tmp"
    files, commands = quick_start()
    assert sorted(files) == sorted(FILES), "the quick start no longer shows its three files"
    assert [words[1] for words in commands] == ["preflight", "prebuild", "launch"]
    moved = {
        spec.address: new.address
        for spec, new in zip(demo.HOSTS, demo.hosts_from(FIRST), strict=True)
    }
    cluster = yaml.safe_load(files["cluster.yaml"])
    project = Path(cluster["controller"]["path"])
    hosts = [worker["host"] for worker in cluster["workers"]]
    for name, text in files.items():
        for old, new in moved.items():  # the host addresses, and nothing else
            text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        outside = var_tmp / project.relative_to("/var/tmp")  # the namespace's /var/tmp
        (outside / name).write_text(text)
    done = {}
    for words in commands:
        ran = space.run(inv_argv(*words[1:]), project, env, 600)
        assert ran.returncode == 0, f"{shlex.join(words)}:\n{ran.stderr}"
        done[words[1]] = ran
    launched = done["launch"].stdout + done["launch"].stderr
    for worker in cluster["workers"]:
        assert f"[{worker['host']}] ddp-bench variant={worker['arch']} " in launched, launched
    assert f"launch: ddp-bench finished on {len(hosts)} host(s)" in launched
    assert "Traceback" not in "".join(r.stderr for r in done.values())
    preflight = done["preflight"].stderr
    # every host ok: the summary alone says so (a line per host only beside a problem)
    assert not re.search(r"^  (ok|warning|error) ", preflight, re.M), preflight
    summary = f"preflight: {len(hosts) + 1} ok, 0 with warnings, 0 with errors"  # + the controller
    assert summary in preflight, preflight
