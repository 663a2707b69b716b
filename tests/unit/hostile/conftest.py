"""The shared pieces: hostile strategies, the gatekeepers' verdicts, the recorder sandbox.

The sandbox runs a script with a real shell and ``PATH`` holding only recorder
programs; each recorder writes down its argv, its ``$0``, its physical cwd and
its whole environment. Tests then compare what the recorders saw with the raw
values. ``recorders`` (session) and ``box`` (per test) are the fixtures;
hypothesis tests, which must not take function-scoped fixtures, open their own
sandbox per example with ``with sandbox(recorders) as box:``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import Cluster
from fdl_tasks.config.names import check_command, check_crate_dir
from fdl_tasks.config.variants import cargo_features
from fdl_tasks.core.errors import FdlError

T = TypeVar("T")

SOURCE = "cluster.yaml"
#: How every refusal of a cluster file starts (docs/cluster-file.md, "Validation and bad input").
REFUSAL = f"{SOURCE} is not a valid cluster file: "
MARKER = "PWNED"

# ---------------------------------------------------------------------------
# strategies

PAYLOADS = (
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"; touch {MARKER}",
    f"| touch {MARKER}",
    f"&& touch {MARKER}",
    f"|| touch {MARKER}",
    f"& touch {MARKER} &",
    f">{MARKER}",
    f">>{MARKER}",
    f"<{MARKER}",
    f"\ntouch {MARKER}\n",
    "$(rm -rf ~)",
    "'",
    '"',
    "\\",
    " ",
    "  ",
    "\t",
    "*",
    "?",
    "[a-z]",
    "~",
    "~root",
    "{a,b}",
    "$HOME",
    "${IFS}",
    "$1",
    "$@",
    "!",
    "#",
    "=",
    ":",
    ",",
    "%h",
    "-",
    "--",
    "-rf",
    "--help",
    "..",
    ".",
    "/",
    "../",
    "/..",
    "./",
    "é",
    "日本語",
    "\u2028",
    "\x85",
    "\u202e",
    "\ufeff",
    "\x00",
    "\x01",
    "\x1b[31m",
    "\r",
    "\x7f",
    "",
)
#: Generation only: the execution tests mostly leave out ASCII control characters so
#: that most of their examples get past the loader. What is accepted is never decided here.
_ASCII_CONTROL = frozenset(map(chr, [*range(32), 127]))

fragment = st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=4))
hostile = st.lists(fragment, max_size=6).map("".join)
printable = st.lists(
    st.one_of(
        st.sampled_from([p for p in PAYLOADS if not _ASCII_CONTROL.intersection(p)]),
        st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=4),
    ),
    max_size=6,
).map("".join)
no_nul = hostile.map(lambda s: s.replace("\x00", ""))

# Plausible values, so that an execution test mostly gets as far as the shell; the
# gatekeepers, not these patterns, decide what is accepted (see ``mostly``).
label_segment = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)
arch_segment = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,10}", fullmatch=True)
good_arches = st.lists(arch_segment, min_size=1, max_size=3).map("/".join)
commands = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True)
crate_dirs = st.lists(
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,8}", fullmatch=True), max_size=2
).map("/".join)
#: Variables the sandbox itself runs on: a generated env must not replace them.
SANDBOX_VARIABLES = frozenset({"PATH", "FDL_RECORDS", "HOME"})
env_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), st.just("LD_LIBRARY_PATH")
).filter(lambda name: name not in SANDBOX_VARIABLES)

labels = st.one_of(
    hostile,
    label_segment,
    st.sampled_from(["..", ".", "a/b", "../x", "_shared", "-x", "a..", "a/../b", "", "x\x00"]),
)
arches = st.one_of(
    hostile,
    st.lists(st.one_of(arch_segment, hostile), min_size=1, max_size=3).map("/".join),
    st.sampled_from(
        ["..", "../x", "/abs", "a/../b", "a//b", "a/", "cu128/..", "a/./b", "precompiled/cu128"]
    ),
)
# Anything YAML can produce where a scalar is expected.
yaml_values = st.one_of(
    hostile,
    hostile,
    hostile,
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.lists(hostile, max_size=2),
    st.dictionaries(hostile, hostile, max_size=2),
)


yaml_keys = st.one_of(hostile, st.integers(), st.booleans(), st.none())


def mostly(valid: st.SearchStrategy[T], odds: int = 8) -> st.SearchStrategy[T | str]:
    """``valid``, but about one draw in ``odds + 1`` is a hostile string instead.

    The hostile strings are also used as env names, hence the filters.

    (Listing ``valid`` ``odds`` times in ``st.one_of`` does not weight it: hypothesis
    then prefers the branch with the most novel values, the hostile one.)
    """
    hostile_names = hostile.filter(lambda name: name not in SANDBOX_VARIABLES)
    pick = st.sampled_from([False] * odds + [True])
    return st.tuples(pick, valid, hostile_names).map(lambda t: t[2] if t[0] else t[1])


# ---------------------------------------------------------------------------
# cluster files and the gatekeepers' verdicts


def base_cluster(root: str = "/srv/proj") -> dict[str, Any]:
    """A valid cluster.yaml as parsed YAML, every optional section present."""
    return {
        "controller": {
            "path": root,
            "arch": "precompiled/cu128",
            "data_path": "/flodl/data",
            "docker": {"image": "img", "run_args": ["--gpus", "all"], "env": {"A": "1"}},
        },
        "workers": [
            {
                "host": "node-a",
                "path": "/mnt/proj",
                "arch": "precompiled/cpu",
                "data_path": "/flodl/data",
                "ssh": {"target": "10.0.0.2", "user": "me", "options": ["ProxyJump=b"]},
                "env": {"B": "2"},
            }
        ],
        "env": {"C": "3"},
    }


def one_worker(
    path: str, label: str = "node-a", arch: str | None = "precompiled/cu128", **extra: Any
) -> dict[str, Any]:
    worker: dict[str, Any] = {"host": label, "path": path, **extra}
    if arch is not None:
        worker["arch"] = arch
    return worker


def _note(what: str) -> None:
    if currently_in_test_context():
        event(what)


def assert_one_paragraph(message: str) -> None:
    """One printable line: no raw newline, line separator or control character."""
    assert len(message.splitlines()) == 1 and message.isprintable(), repr(message)


def load(data: object, *fields: str) -> Cluster | None:
    """The loader's verdict: a cluster, or ``None`` for a clean :class:`FdlError`.

    With ``fields`` (key paths such as ``workers[0].path`` or ``env[``), a
    refusal must be one paragraph whose first problem is one of them. Any
    other exception type propagates and fails the test.
    """
    try:
        cluster = parse_cluster(data, SOURCE)
    except FdlError as exc:
        message = str(exc)
        assert message.startswith(SOURCE), message
        assert "Traceback" not in message
        if fields:
            assert_one_paragraph(message)
            named = tuple(REFUSAL + field for field in fields)
            assert message.startswith(named), (message, fields)
        _note("refused by the loader")
        return None
    _note("accepted by the loader")
    return cluster


def checked_command(name: str) -> str | None:
    """``check_command``'s verdict: the name, or ``None`` for its one clean refusal."""
    try:
        accepted = check_command(name)
    except FdlError as exc:
        message = str(exc)
        assert message.startswith(f"command {name!r} is not a valid binary name"), message
        assert_one_paragraph(message)
        _note("command refused")
        return None
    assert accepted == name
    return accepted


def checked_crate_dir(relative: str) -> str | None:
    """``check_crate_dir``'s verdict: the cleaned path, or ``None`` for its one clean refusal."""
    try:
        return check_crate_dir(relative)
    except FdlError as exc:
        message = str(exc)
        assert message.startswith(f"crate directory {relative!r} must be a relative path"), message
        assert_one_paragraph(message)
        _note("crate directory refused")
        return None


def host_binary(path: str, label: str, arch: str, command: str) -> str:
    """Where a worker's binary lives, as docs/builds.md lays it out (``/`` in the arch → ``-``)."""
    return f"{path.rstrip('/')}/target/cluster/{label}/{arch.replace('/', '-')}/release/{command}"


def cargo_tail(command: str, arch: str) -> list[str]:
    features = ["--features", "cuda"] if cargo_features(arch) else []
    # cargo's progress bar, asked for through the pipe (the live display reads it)
    progress = ["--config", 'term.progress.when="always"', "--config", "term.progress.width=200"]
    return ["cargo", "build", "--release", *features, "--bin", command, *progress]


# ---------------------------------------------------------------------------
# the recorder sandbox

#: Every external command a script under test may call; each is a recorder.
RECORDED_COMMANDS = (
    "env",
    "setsid",
    "docker",
    "docker-compose",
    "cargo",
    "sha256sum",
    "cut",
    "od",
    "ldd",
    "ldconfig",
    "getconf",
    "readlink",
    "grep",
    "sed",
    "head",
    "tr",
    "uname",
    "touch",
    "rm",
    "id",
    "cat",
    "ls",
    "sh",
    "bash",
)
#: Recorders that then run their arguments, as the real programs would: env(1) is
#: the real one, so what it passes on is decided by env(1), not by these tests.
PASS_THROUGH = {"env": 'exec /usr/bin/env "$@"', "setsid": 'exec "$@"'}
#: The recorder's own shell variable (the script under test may export any other name).
_COUNTER = "__fdl_record_count"

# One record per call, NUL-separated: argc, $0, physical cwd, argv, then the
# environment as env -0 prints it. A record is named by how many came before it
# (so calls made one after another read back in order) and by its process id (so
# the members of a pipeline, which run at once, never share a name).
RECORDER = f"""#!/bin/sh
{_COUNTER}=0
for __fdl_record in "$FDL_RECORDS"/*; do
    [ -e "$__fdl_record" ] && {_COUNTER}=$(({_COUNTER} + 1))
done
{{ printf '%s\\0' "$#" "$0" "$(pwd -P)" "$@"; /usr/bin/env -0; }} \\
    > "$FDL_RECORDS/$(printf %06d "${_COUNTER}").$$"
"""


def write_recorder(path: Path, then: str = "") -> None:
    """A recorder program at ``path``; ``then`` runs after it has written its record."""
    path.write_text(RECORDER + then + "\n")
    path.chmod(0o755)


def make_recorders(bin_dir: Path, exit_codes: Mapping[str, int] | None = None) -> Path:
    """A ``PATH`` directory of recorders: :data:`RECORDED_COMMANDS` plus ``exit_codes``' names.

    ``exit_codes`` adds recorders (or overrides pass-through ones) that exit
    with the given status, e.g. ``{"pgrep": 1}`` for "no process matched".
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in RECORDED_COMMANDS:
        write_recorder(bin_dir / name, PASS_THROUGH.get(name, ""))
    for name, code in (exit_codes or {}).items():
        write_recorder(bin_dir / name, f"exit {code}")
    return bin_dir


@attrs.frozen
class Call:
    """One recorded call: what the program was started as, where, with what."""

    program: str
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]

    @property
    def name(self) -> str:
        return self.program.rsplit("/", 1)[-1]

    @property
    def ld_library_path(self) -> str | None:
        return self.env.get("LD_LIBRARY_PATH")


class Sandbox:
    """A temp root to run scripts in; every external command is a recorder."""

    def __init__(self, base: Path, bin_dir: Path) -> None:
        self.root = base / "root"
        self.records = base / "records"
        self.root.mkdir()
        self.records.mkdir()
        self.bin_dir = bin_dir

    def path(self, suffix: str) -> str:
        """``root/<suffix>`` with ``..`` segments that would climb above root defused."""
        depth, parts = 0, []
        for segment in suffix.split("/"):
            if segment == ".." and depth == 0:
                segment = "..x"
            depth += -1 if segment == ".." else 0 if segment in ("", ".") else 1
            parts.append(segment)
        return f"{self.root}/" + "/".join(parts)

    def install(self, path: str) -> None:
        """Put a recorder at ``path`` (creating its directories), e.g. as the launched binary."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_recorder(Path(path))

    def tree(self) -> set[str]:
        found: set[str] = set()
        for directory, subdirs, files in os.walk(self.root):
            found.update(os.path.join(directory, n) for n in subdirs + files)
        return found

    def run(
        self, script: str, shell: str = "/bin/sh", bin_dir: Path | None = None
    ) -> tuple[list[Call], str]:
        """Run ``script`` with ``shell -c``: the calls recorded, in order, and stdout.

        Fails on a non-zero exit, on anything written to stderr and on any new
        file under the root (a payload's ``touch`` or redirection).
        """
        before = self.tree()
        done = subprocess.run(
            [shell, "-c", script],
            cwd=self.root,
            env={
                "PATH": str(bin_dir or self.bin_dir),
                "FDL_RECORDS": str(self.records),
                "HOME": str(self.root),
            },
            capture_output=True,
            timeout=30,
        )
        stderr = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 0, stderr
        assert stderr == "", stderr
        assert self.tree() == before, "the command created files: " + repr(self.tree() - before)
        calls = []
        for record in sorted(self.records.iterdir()):
            calls.append(self._read(record))
            record.unlink()
        return calls, done.stdout.decode("utf-8", "surrogateescape")

    @staticmethod
    def _read(path: Path) -> Call:
        fields = path.read_bytes().decode("utf-8", "surrogateescape").split("\0")
        assert fields[-1] == ""
        argc = int(fields[0])
        assert len(fields) >= 4 + argc, fields
        program, cwd = fields[1:3]
        environment = dict(item.split("=", 1) for item in fields[3 + argc : -1])
        return Call(program, tuple(fields[3 : 3 + argc]), cwd, environment)


@contextmanager
def sandbox(bin_dir: Path) -> Iterator[Sandbox]:
    """A fresh sandbox on the recorders in ``bin_dir``; for hypothesis examples."""
    with tempfile.TemporaryDirectory(prefix="fdl-hostile-") as base:
        yield Sandbox(Path(base), bin_dir)


@pytest.fixture(scope="session")
def recorders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``PATH`` directory of recorders, shared by every test."""
    return make_recorders(tmp_path_factory.mktemp("recorders"))


@pytest.fixture
def box(recorders: Path) -> Iterator[Sandbox]:
    """A fresh sandbox for a test that is not a hypothesis test."""
    with sandbox(recorders) as fresh:
        yield fresh
