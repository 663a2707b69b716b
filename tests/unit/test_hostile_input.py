"""Hostile input never reaches a shell as code and never escapes ``target/cluster/``.

Every value a user controls (host labels, paths, arches, env names and values,
docker image/run_args/env, ssh options from cluster.yaml; ``--cmd`` and
``--crate-dir`` from the command line) is generated with shell metacharacters,
spaces, leading ``-``, ``..``, ``/``, unicode and control characters, and fed
through the real loader. What the loader accepts is then rendered into the real
command lines and executed by ``/bin/sh`` with ``PATH`` set to a directory of
recorder scripts: the tests compare the argv the recorders received with the
raw values, and check that no payload created a file or ran a command.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import paramiko
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from fdl_tasks.envelope import PerHostEnvelope
from fdl_tasks.errors import FdlError
from fdl_tasks.launch import launch_command
from fdl_tasks.loader import parse_cluster
from fdl_tasks.model import Cluster, DockerSettings, Worker
from fdl_tasks.plan import docker_command, native_command, plan_builds
from fdl_tasks.probe import ProbeRequest, parse_facts
from fdl_tasks.remote import HONOURED_OPTIONS, ssh_config_block
from fdl_tasks.rules import (
    arch_cuda,
    binary_path,
    cargo_features,
    check_command,
    check_crate_dir,
    join_path,
    target_dir,
)
from fdl_tasks.verify import parse_verification, verification_script
from tests.conftest import REPO, run_inv

SOURCE = "cluster.yaml"
MARKER = "PWNED"

# What the loader may accept; used to state "accepted => safe" as properties.
SAFE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SAFE_ARCH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SAFE_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SAFE_COMMAND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
SAFE_CRATE_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

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

fragment = st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=4))
hostile = st.lists(fragment, max_size=6).map("".join)
# The same without the control characters the loader refuses in paths and most text (so
# that the execution tests are not mostly filtered out); env values and user args keep them.
printable = st.lists(
    st.one_of(
        st.sampled_from([p for p in PAYLOADS if not CONTROL.search(p)]),
        st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=4),
    ),
    max_size=6,
).map("".join)
no_nul = hostile.map(lambda s: s.replace("\x00", ""))

label_segment = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)
arch_segment = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,10}", fullmatch=True)
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
# Values the loader always accepts: for the execution tests, where hostility is in paths.
good_arches = st.lists(arch_segment, min_size=1, max_size=3).map("/".join)
commands = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True)
crate_dirs = st.lists(
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,8}", fullmatch=True), max_size=2
).map("/".join)
env_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), st.just("LD_LIBRARY_PATH")
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


def load(data: object) -> Cluster | None:
    """The loader's verdict: a cluster, or ``None`` for a clean :class:`FdlError`.

    Any other exception type propagates and fails the test.
    """
    try:
        return parse_cluster(data, SOURCE)
    except FdlError as exc:
        message = str(exc)
        assert message.startswith(SOURCE), message
        assert "Traceback" not in message
        return None


def one_worker(
    path: str,
    label: str = "node-a",
    arch: str | None = "precompiled/cu128",
    **extra: Any,
) -> dict[str, Any]:
    worker: dict[str, Any] = {"host": label, "path": path, **extra}
    if arch is not None:
        worker["arch"] = arch
    return worker


# ---------------------------------------------------------------------------
# 1. the loader: FdlError or the value verbatim, and accepted values are safe


@attrs.frozen
class Field:
    """Where a generated value goes in cluster.yaml and where it comes back out."""

    put: Callable[[dict[str, Any], Any], None]
    get: Callable[[Cluster], Any]
    check: Callable[[Any], None] = lambda value: None


def _w(data: dict[str, Any]) -> dict[str, Any]:
    worker: dict[str, Any] = data["workers"][0]
    return worker


def _docker(data: dict[str, Any]) -> dict[str, Any]:
    docker: dict[str, Any] = data["controller"]["docker"]
    return docker


def _dk(cluster: Cluster) -> DockerSettings:
    docker = cluster.controller.docker
    assert isinstance(docker, DockerSettings)
    return docker


def _is_label(value: Any) -> None:
    assert isinstance(value, str) and SAFE_LABEL.fullmatch(value), value


def _is_arch(value: Any) -> None:
    if value is None:
        return
    assert isinstance(value, str) and not value.startswith("/"), value
    assert all(SAFE_ARCH_SEGMENT.fullmatch(s) for s in value.split("/")), value


def _is_path(value: Any) -> None:
    if value is None:
        return
    assert isinstance(value, str) and value.startswith("/"), value
    assert not CONTROL.search(value), value


def _is_text(value: Any) -> None:
    assert value is None or (isinstance(value, str) and not CONTROL.search(value)), value


def _is_env_value(value: Any) -> None:
    assert isinstance(value, str) and "\x00" not in value, value


def _is_env_names(names: Any) -> None:
    assert all(isinstance(n, str) and SAFE_ENV_NAME.fullmatch(n) for n in names), names


def _is_texts(values: Any) -> None:
    assert all(isinstance(v, str) and not CONTROL.search(v) for v in values), values


def _set(key: str, where: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., None]:
    def put(data: dict[str, Any], value: Any) -> None:
        where(data)[key] = value

    return put


FIELDS: dict[str, Field] = {
    "workers[0].host": Field(_set("host", _w), lambda c: c.workers[0].host, _is_label),
    "workers[0].path": Field(_set("path", _w), lambda c: c.workers[0].path, _is_path),
    "workers[0].data_path": Field(
        _set("data_path", _w), lambda c: c.workers[0].data_path, _is_path
    ),
    "workers[0].arch": Field(_set("arch", _w), lambda c: c.workers[0].arch, _is_arch),
    "controller.path": Field(
        _set("path", lambda d: d["controller"]), lambda c: c.controller.path, _is_path
    ),
    "controller.arch": Field(
        _set("arch", lambda d: d["controller"]), lambda c: c.controller.arch, _is_arch
    ),
    "controller.data_path": Field(
        _set("data_path", lambda d: d["controller"]), lambda c: c.controller.data_path, _is_path
    ),
    "docker.image": Field(_set("image", _docker), lambda c: _dk(c).image, _is_text),
    "docker.workspace": Field(_set("workspace", _docker), lambda c: _dk(c).workspace, _is_path),
    "docker.libtorch": Field(_set("libtorch", _docker), lambda c: _dk(c).libtorch, _is_path),
    "docker.cuda_version": Field(
        _set("cuda_version", _docker), lambda c: _dk(c).cuda_version, _is_text
    ),
    "docker.run_args[]": Field(
        lambda d, v: _docker(d).__setitem__("run_args", [v]),
        lambda c: _dk(c).run_args[0],
        _is_text,
    ),
    "docker.env value": Field(
        lambda d, v: _docker(d).__setitem__("env", {"K": v}),
        lambda c: _dk(c).env["K"],
        _is_env_value,
    ),
    "workers[0].env value": Field(
        lambda d, v: _w(d).__setitem__("env", {"K": v}),
        lambda c: c.workers[0].env["K"],
        _is_env_value,
    ),
    "env value": Field(
        lambda d, v: d.__setitem__("env", {"K": v}), lambda c: c.env["K"], _is_env_value
    ),
    "workers[0].ssh.options[]": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("options", [v]),
        lambda c: c.workers[0].ssh.options[0],
        _is_text,
    ),
    "workers[0].ssh.target": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("target", v),
        lambda c: c.workers[0].ssh.target,
        _is_text,
    ),
    "workers[0].ssh.user": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("user", v),
        lambda c: c.workers[0].ssh.user,
        _is_text,
    ),
    "workers[0].ssh.identity_file": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("identity_file", v),
        lambda c: c.workers[0].ssh.identity_file,
        _is_text,
    ),
}

ENV_NAME_FIELDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "env": lambda d: d,
    "workers[0].env": _w,
    "docker.env": _docker,
}


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(sorted(FIELDS)), value=yaml_values)
@example(field="env value", value="a\x00b")
@example(field="workers[0].env value", value="a\nb; touch PWNED")
@example(field="workers[0].path", value="/a\nb")
@example(field="workers[0].host", value="../x")
@example(field="workers[0].host", value="a/b")
@example(field="workers[0].arch", value="../x")
@example(field="workers[0].arch", value="/abs")
@example(field="controller.arch", value="a//b")
@example(field="workers[0].ssh.options[]", value="ProxyJump=a\nProxyCommand=touch PWNED")
@example(field="docker.run_args[]", value="--x\x1b[31m")
def test_loader_rejects_with_fdl_error_or_keeps_the_value_verbatim(field: str, value: Any) -> None:
    spec = FIELDS[field]
    data = base_cluster()
    spec.put(data, value)
    cluster = load(data)
    if cluster is None:
        return
    got = spec.get(cluster)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    assert got == (str(value) if numeric and "env" in field else value)
    spec.check(got)


@settings(max_examples=150, deadline=None)
@given(where=st.sampled_from(sorted(ENV_NAME_FIELDS)), name=yaml_keys, value=hostile)
def test_env_names_are_identifiers_or_rejected(where: str, name: Any, value: str) -> None:
    data = base_cluster()
    ENV_NAME_FIELDS[where](data)["env"] = {name: value}
    cluster = load(data)
    if cluster is None:
        return
    envs = {
        "env": cluster.env,
        "workers[0].env": cluster.workers[0].env,
        "docker.env": _dk(cluster).env,
    }
    names = list(envs[where])
    assert names == [name]
    _is_env_names(names)


@settings(max_examples=100, deadline=None)
@given(document=st.recursive(yaml_values, lambda inner: st.lists(inner, max_size=3), max_leaves=8))
def test_any_document_shape_gives_fdl_error_never_a_crash(document: Any) -> None:
    load(document)
    load({"controller": document, "workers": [document]})
    load({"cluster": {"controller": {"path": "/p"}, "workers": document}})


# ---------------------------------------------------------------------------
# 2. tree escape: a label is one segment, an arch slug is one segment


@settings(max_examples=400, deadline=None)
@given(
    hosts=st.lists(st.tuples(labels, arches), min_size=1, max_size=3),
    command=commands,
)
@example(hosts=[("a..", "x/..y"), ("a.", "x-..y")], command="x")
@example(hosts=[("..", "x")], command="x")
@example(hosts=[("a", "../../x")], command="x")
def test_accepted_labels_and_arches_stay_inside_target_cluster(
    hosts: list[tuple[str, str]], command: str
) -> None:
    cluster = load(
        {
            "controller": {"path": "/p"},
            "workers": [one_worker("/p", label, arch) for label, arch in hosts],
        }
    )
    if cluster is None:
        return
    for worker in cluster.workers:
        assert worker.arch is not None
        _is_label(worker.host)
        _is_arch(worker.arch)
        target = os.path.normpath(target_dir(worker.host, worker.arch)).split("/")
        assert len(target) == 4, target
        assert target[:3] == ["target", "cluster", worker.host]
        assert target[3] not in ("", ".", "..")
        assert not target[2].startswith("_"), "host dirs must never collide with _shared"
        binary = os.path.normpath(binary_path(worker.host, worker.arch, command)).split("/")
        assert binary == [*target, "release", command]
    host_dirs = [os.path.normpath(target_dir(w.host, w.arch or "")) for w in cluster.workers]
    assert len(set(host_dirs)) == len(host_dirs), "two hosts share a target dir"
    for job in plan_builds(cluster.workers, None, command, "", shared=True):
        shared = os.path.normpath(job.target_dir).split("/")
        assert len(shared) == 4 and shared[:3] == ["target", "cluster", "_shared"], shared
        assert shared[3] not in ("", ".", "..")
        assert os.path.normpath(job.built_binary).split("/") == [*shared, "release", command]
        for host in job.hosts:
            mine = os.path.normpath(job.host_binary(host)).split("/")
            assert mine[:3] == ["target", "cluster", host] and len(mine) == 6, mine
    for job in plan_builds(cluster.workers, None, command, "", shared=False):
        (host,) = job.hosts
        own = os.path.normpath(job.target_dir).split("/")
        assert own[:3] == ["target", "cluster", host] and len(own) == 4, own


# ---------------------------------------------------------------------------
# 3. no injection: the real shell runs the commands, recorders take the argv

RECORDED_COMMANDS = (
    "env",
    "setsid",
    "docker",
    "cargo",
    "sha256sum",
    "cut",
    "ldd",
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
# One record per call, NUL-separated: argc, name, physical cwd, LD_LIBRARY_PATH, argv.
RECORDER = """#!/bin/sh
printf '%s\\0' "$#" "${0##*/}" "$(pwd -P)" "${LD_LIBRARY_PATH+set}" \
"${LD_LIBRARY_PATH-}" "$@" > "$FDL_RECORDS/$$"
"""


@attrs.frozen
class Call:
    name: str
    argv: tuple[str, ...]
    cwd: str
    ld_library_path: str | None


@pytest.fixture(scope="module")
def recorders() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fdl-rec-") as base:
        bin_dir = Path(base)
        for name in RECORDED_COMMANDS:
            script = bin_dir / name
            script.write_text(RECORDER)
            script.chmod(0o755)
        yield bin_dir


class Sandbox:
    """A temp root to run one script in; every external command is a recorder."""

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

    def tree(self) -> set[str]:
        found: set[str] = set()
        for directory, subdirs, files in os.walk(self.root):
            found.update(os.path.join(directory, n) for n in subdirs + files)
        return found

    def run(self, script: str) -> tuple[list[Call], str]:
        """Run ``script`` with /bin/sh; the calls recorded and stdout. Fails on any new file."""
        before = self.tree()
        done = subprocess.run(
            ["/bin/sh", "-c", script],
            cwd=self.root,
            env={
                "PATH": str(self.bin_dir),
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
        calls = [self._read(p) for p in sorted(self.records.iterdir())]
        return calls, done.stdout.decode("utf-8", "surrogateescape")

    @staticmethod
    def _read(path: Path) -> Call:
        fields = path.read_bytes().decode("utf-8", "surrogateescape").split("\0")
        assert fields[-1] == ""
        argc = int(fields[0])
        assert len(fields) == 6 + argc, fields
        name, cwd, ld_set, ld_value = fields[1:5]
        return Call(name, tuple(fields[5 : 5 + argc]), cwd, ld_value if ld_set else None)


@contextmanager
def sandbox(bin_dir: Path) -> Iterator[Sandbox]:
    with tempfile.TemporaryDirectory(prefix="fdl-hostile-") as base:
        yield Sandbox(Path(base), bin_dir)


def cargo_tail(command: str, arch: str) -> list[str]:
    features = ["--features", "cuda"] if cargo_features(arch) else []
    return ["cargo", "build", "--release", *features, "--bin", command]


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    label=label_segment,
    arch=good_arches,
    command=commands,
    crate=crate_dirs,
    shared=st.booleans(),
)
def test_native_command_shell_sees_every_value_as_one_word(
    recorders: Path, suffix: str, label: str, arch: str, command: str, crate: str, shared: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load({"controller": {"path": path}, "workers": [one_worker(path, label, arch)]})
        assume(cluster is not None)
        assert cluster is not None
        crate_dir = check_crate_dir(crate)
        os.makedirs(join_path(path, crate_dir), exist_ok=True)
        (job,) = plan_builds(cluster.workers, None, command, crate_dir, shared)
        calls, _ = box.run(native_command(job, cluster.controller))
        base = path.rstrip("/")
        assert calls == [
            Call(
                "setsid",
                (
                    "env",
                    f"LIBTORCH_PATH={base}/libtorch/{arch}",
                    f"CARGO_TARGET_DIR={base}/{job.target_dir}",
                    *cargo_tail(command, arch),
                ),
                os.path.realpath(join_path(path, crate_dir)),
                None,
            )
        ]


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    workspace=printable,
    libtorch=printable,
    image=st.tuples(printable, st.booleans(), printable),
    run_args=st.lists(printable, max_size=3),
    env=st.dictionaries(env_names, no_nul, max_size=3),
    arch=good_arches,
    command=commands,
    crate=crate_dirs,
    user=st.sampled_from([None, "1000:1000"]),
)
def test_docker_command_argv_is_exactly_the_raw_values(
    recorders: Path,
    suffix: str,
    workspace: str,
    libtorch: str,
    image: tuple[str, bool, str],
    run_args: list[str],
    env: dict[str, str],
    arch: str,
    command: str,
    crate: str,
    user: str | None,
) -> None:
    before, after = (s.replace("{", "").replace("}", "") for s in (image[0], image[2]))
    templated = image[1]
    raw_image = before + ("{cuda_tag}" if templated else "") + after
    with sandbox(recorders) as box:
        path = box.path(suffix)
        docker = {
            "image": raw_image,
            "cuda_version": "12.8",
            "workspace": "/" + workspace,
            "libtorch": "/" + libtorch,
            "run_args": run_args,
            "env": env,
        }
        cluster = load(
            {
                "controller": {"path": path, "docker": docker},
                "workers": [one_worker("/w", "node-a", arch)],
            }
        )
        assume(cluster is not None)
        assert cluster is not None and isinstance(cluster.controller.docker, DockerSettings)
        crate_dir = check_crate_dir(crate)
        (job,) = plan_builds(cluster.workers, cluster.controller.docker, command, crate_dir, True)
        calls, _ = box.run(
            docker_command(job, cluster.controller, cluster.controller.docker, "r1", user)
        )
        cuda = arch_cuda(arch)
        version = cuda.tag if cuda else "12.8"
        expected_image = before + (version if templated else "") + after
        ws = "/" + workspace
        expected = [
            "run",
            "--rm",
            "--name",
            "fdl-r1-" + job.name.replace("/", "-").lstrip("_"),
            "--label",
            "fdl-tasks.run=r1",
            "--label",
            f"fdl-tasks.job={job.name}",
            *(["--user", user] if user else []),
            "-v",
            f"{path}:{ws}",
            "-v",
            f"{path.rstrip('/')}/libtorch/{arch}:/{libtorch}:ro",
            "-w",
            join_path(ws, crate_dir),
            "-e",
            f"CARGO_TARGET_DIR={join_path(ws, job.target_dir)}",
            "-e",
            f"LIBTORCH_PATH=/{libtorch}",
            *[item for name, value in env.items() for item in ("-e", f"{name}={value}")],
            *run_args,
            expected_image,
            *cargo_tail(command, arch),
        ]
        assert [c.name for c in calls] == ["docker"]
        assert list(calls[0].argv) == expected


LAUNCHED = """#!/bin/sh
{ printf '%s\\0' "$(pwd -P)" "$#" "$@"; /usr/bin/env -0; } > "$FDL_RECORDS/../launched"
"""


def check_launch(
    box: Sandbox,
    path: str,
    label: str,
    arch: str,
    command: str,
    crate: str,
    cluster_env: Mapping[str, str],
    worker_env: Mapping[str, str],
    args: Sequence[str],
) -> bool:
    """Run one launch command; ``False`` if the loader refused the values.

    The binary itself is a recorder: it writes its cwd, its argv and its whole
    environment, so the test sees exactly what the launched program would.
    """
    cluster = load(
        {
            "controller": {"path": "/p"},
            "workers": [one_worker(path, label, arch, env=dict(worker_env))],
            "env": dict(cluster_env),
        }
    )
    if cluster is None:
        return False
    worker = cluster.workers[0]
    crate_dir = check_crate_dir(crate)
    os.makedirs(join_path(path, crate_dir), exist_ok=True)
    entry = PerHostEnvelope.for_worker(worker, command, crate_dir)
    binary = f"{path.rstrip('/')}/target/cluster/{label}/{arch.replace('/', '-')}/release/{command}"
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    Path(binary).write_text(LAUNCHED)
    Path(binary).chmod(0o755)
    calls, _ = box.run(launch_command(worker, entry, cluster.env, args))
    assert calls == []  # nothing but the binary ran: no env(1), no stray command
    fields = (box.records.parent / "launched").read_bytes().decode("utf-8", "surrogateescape")
    cwd, argc, *rest = fields.split("\0")
    assert cwd == os.path.realpath(join_path(path, crate_dir))
    assert rest[: int(argc)] == list(args)
    seen = dict(item.split("=", 1) for item in rest[int(argc) :] if "=" in item)
    library = f"{path.rstrip('/')}/libtorch/{arch}/lib"
    environment = {"LD_LIBRARY_PATH": library, **cluster_env, **worker_env}
    for name, value in environment.items():
        assert seen.get(name) == value, name
    return True


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    label=label_segment,
    arch=good_arches,
    command=commands,
    crate=crate_dirs,
    cluster_env=st.dictionaries(env_names, no_nul, max_size=3),
    worker_env=st.dictionaries(env_names, no_nul, max_size=3),
    args=st.lists(no_nul, max_size=4),
)
def test_launch_command_exports_raw_values_and_execs_the_binary(
    recorders: Path,
    suffix: str,
    label: str,
    arch: str,
    command: str,
    crate: str,
    cluster_env: dict[str, str],
    worker_env: dict[str, str],
    args: list[str],
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        assume(check_launch(box, path, label, arch, command, crate, cluster_env, worker_env, args))


def test_launch_command_worker_path_with_equals_sign(recorders: Path) -> None:
    """A path with ``=`` once made env(1) exec the first user argument instead."""
    with sandbox(recorders) as box:
        assert check_launch(
            box,
            box.path("run=1"),
            "node-a",
            "precompiled/cu128",
            "ddp-bench",
            "",
            {},
            {},
            ["--epochs", "3"],
        )


PROBE_ABI_CALLS = [
    ("head", ("-n", "2")),
    ("ldd", ("--version",)),
    ("tr", ("\\n", " ")),
    ("uname", ("-m",)),
]


@settings(max_examples=60, deadline=None)
@given(suffix=printable, declared=st.booleans(), abi=st.booleans(), exists=st.booleans())
def test_probe_script_tests_the_hostile_data_path_and_runs_nothing_else(
    recorders: Path, suffix: str, declared: bool, abi: bool, exists: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {"controller": {"path": "/p"}, "workers": [one_worker("/w", data_path=path)]}
        )
        assume(cluster is not None)
        assert cluster is not None
        if exists:
            os.makedirs(path, exist_ok=True)
        elif os.path.lexists(os.path.realpath(path)):
            return  # suffix resolved to the root itself or to an existing directory
        request = ProbeRequest(cluster.workers[0].data_path or "", declared, abi)
        calls, stdout = box.run(request.script())
        facts = parse_facts(stdout)
        assert facts is not None, stdout
        assert facts.data == ("ok" if exists else "missing"), stdout
        assert sorted((c.name, c.argv) for c in calls) == (PROBE_ABI_CALLS if abi else [])
        if abi:
            assert facts.pkill is False


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    label=label_segment,
    arch=good_arches,
    command=commands,
    crate=crate_dirs,
    present=st.booleans(),
)
def test_verification_script_hashes_and_ldds_exactly_the_hostile_binary_path(
    recorders: Path, suffix: str, label: str, arch: str, command: str, crate: str, present: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load({"controller": {"path": "/p"}, "workers": [one_worker(path, label, arch)]})
        assume(cluster is not None)
        assert cluster is not None
        worker = cluster.workers[0]
        entry = PerHostEnvelope.for_worker(worker, command, check_crate_dir(crate))
        binary = join_path(worker.path, entry.bin)
        if present:
            os.makedirs(os.path.dirname(binary), exist_ok=True)
            Path(binary).write_bytes(b"\x7fELF")
        calls, stdout = box.run(verification_script(worker.path, entry))
        names = sorted(c.name for c in calls)
        assert names == sorted(["cut", "sha256sum"] * present + ["head", "ldd", "ldd", "sed", "tr"])
        if present:
            (hashed,) = [c for c in calls if c.name == "sha256sum"]
            assert hashed.argv == (binary,)
        lddeds = {c.argv: c.ld_library_path for c in calls if c.name == "ldd"}
        assert lddeds == {(binary,): entry.ld_library_path, ("--version",): None}
        copy = parse_verification(stdout)
        assert copy is not None and (copy.sha256 is None) == (not present), stdout


# ---------------------------------------------------------------------------
# ssh options: an ssh_config block that says exactly what was written, nothing more

SSH_KEYS = sorted(
    {"HostName", "Port", "User", "IdentityFile", "ProxyJump", "ProxyCommand"}
    | {"ConnectTimeout", "ForwardAgent", "Host", "Match", "LocalCommand", "SendEnv"}
)
SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*)")


def ssh_options() -> st.SearchStrategy[str]:
    def build(key: str, sep: str, value: str) -> str:
        return f"{key}{sep}{value.strip() or 'v'}"

    return st.builds(
        build,
        st.sampled_from(SSH_KEYS).map(lambda k: k if k != "Port" else "port"),
        st.sampled_from(["=", " ", " = ", " ="]),
        hostile,
    )


def parsed_ssh_config(worker: Worker) -> tuple[list[dict[str, Any]], list[str]]:
    block, ignored = ssh_config_block(worker)
    config = paramiko.SSHConfig.from_text(block)
    contexts: list[dict[str, Any]] = vars(config)["_config"]
    return contexts, ignored


def expected_ssh_config(options: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """OpenSSH semantics: first value wins, IdentityFile accumulates, quotes are removed."""
    config: dict[str, Any] = {}
    ignored = []
    for option in options:
        match = SSH_OPTION.fullmatch(option)
        assert match is not None
        key, value = match.group(1).lower(), match.group(2).strip()
        if key not in HONOURED_OPTIONS:
            ignored.append(match.group(1))
            continue
        if key == "proxycommand" and value.lower() == "none":
            config.setdefault(key, None)
            continue
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1]
        if key == "identityfile":
            config.setdefault(key, []).append(value)
        else:
            config.setdefault(key, value)
    return config, ignored


def check_ssh_options(options: list[str]) -> None:
    cluster = load(
        {"controller": {"path": "/p"}, "workers": [one_worker("/w", ssh={"options": options})]}
    )
    if cluster is None:
        return
    for option in cluster.workers[0].ssh.options:
        _is_text(option)
    contexts, ignored = parsed_ssh_config(cluster.workers[0])
    config, expected_ignored = expected_ssh_config(options)
    # One "Host *" block holding exactly the honoured options: nothing injected a
    # second directive, a Host/Match block or a different value.
    assert contexts == [{"host": ["*"], "config": {}}, {"host": ["*"], "config": config}]
    assert [key.strip() for key in ignored] == expected_ignored


@settings(max_examples=200, deadline=None)
@given(options=st.lists(st.one_of(ssh_options(), hostile), max_size=4))
@example(options=["ProxyJump=a\u2028ProxyCommand=touch PWNED"])
@example(options=["HostName x\x85Port 2", "User=me\u2029IdentityFile=/tmp/k"])
@example(options=["ProxyJump=a\nProxyCommand=touch PWNED"])
def test_ssh_options_become_exactly_the_written_directives(options: list[str]) -> None:
    check_ssh_options(options)


@pytest.mark.parametrize(
    ("option", "accepted"),
    [
        ("ProxyJump =", False),
        ("ConnectTimeout = ", False),
        ("ProxyJump = =bastion", True),
        ("ProxyCommand ssh -W %h:%p -o StrictHostKeyChecking=no bastion", True),
    ],
)
def test_ssh_option_values_are_kept_whole_or_refused(option: str, accepted: bool) -> None:
    """An empty value once crashed paramiko; an ``=`` inside a value was once lost."""
    worker = one_worker("/w", ssh={"options": [option]})
    assert (load({"controller": {"path": "/p"}, "workers": [worker]}) is not None) == accepted
    if accepted:
        check_ssh_options([option])


# ---------------------------------------------------------------------------
# docker image templates: only FdlError


@settings(max_examples=150, deadline=None)
@given(
    image=st.lists(
        st.one_of(
            fragment,
            st.sampled_from(
                [
                    *("{cuda_version}", "{cuda_tag}", "{}", "{0}", "{nope}", "{", "}", "{{", "}}"),
                    *("{cuda_tag!z}", "{cuda_version:d}", "{cuda_tag:>}", "{.}"),
                ]
            ),
        ),
        max_size=5,
    ).map("".join),
    arch=st.sampled_from(["precompiled/cu128", "precompiled/cpu", "builds/sm61-sm120"]),
    default=st.sampled_from([None, "12.8", "{}"]),
)
def test_docker_image_template_gives_fdl_error_or_an_image(
    image: str, arch: str, default: str | None
) -> None:
    docker = {"image": image, "cuda_version": default}
    cluster = load(
        {"controller": {"path": "/p", "docker": docker}, "workers": [one_worker("/w", arch=arch)]}
    )
    if cluster is None:
        return
    try:
        jobs = plan_builds(cluster.workers, cluster.controller.docker, "x", "", True)
    except FdlError:
        return
    assert all(isinstance(job.spec.image, str) for job in jobs)


@pytest.mark.parametrize(
    "image", ["img:{cuda_tag.x}", "img:{cuda_version[a]}", "img:{cuda_tag:>99999999999999}"]
)
def test_docker_image_template_attribute_lookup(image: str) -> None:
    """Lookups and widths in a template once escaped as AttributeError/MemoryError."""
    cluster = load(
        {"controller": {"path": "/p", "docker": {"image": image}}, "workers": [one_worker("/w")]}
    )
    assert cluster is None


# ---------------------------------------------------------------------------
# 4. command-line inputs


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(hostile, commands, labels))
def test_check_command_accepts_only_safe_names(name: str) -> None:
    try:
        accepted = check_command(name)
    except FdlError as exc:
        assert str(exc).startswith(f"command {name!r} is not a valid binary name")
        return
    assert accepted == name
    assert SAFE_COMMAND.fullmatch(name) and ".." not in name and "/" not in name


@settings(max_examples=300, deadline=None)
@given(
    relative=st.one_of(
        hostile,
        crate_dirs,
        st.lists(st.one_of(hostile, st.sampled_from(["..", ".", "", "a"])), max_size=3).map(
            "/".join
        ),
    )
)
def test_check_crate_dir_accepts_only_relative_paths_inside_the_root(relative: str) -> None:
    try:
        cleaned = check_crate_dir(relative)
    except FdlError as exc:
        assert str(exc).startswith(f"crate directory {relative!r} must be a relative path")
        return
    assert not cleaned.startswith("/") and not cleaned.endswith("/")
    segments = cleaned.split("/") if cleaned else []
    assert all(SAFE_CRATE_SEGMENT.fullmatch(s) for s in segments), cleaned
    assert ".." not in segments and "." not in segments
    assert os.path.normpath(f"root/{cleaned}") == ("root/" + cleaned).rstrip("/")


def inv(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_inv(cwd, *args, env={"PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def cli_project() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fdl-cli-") as base:
        root = Path(base)
        (root / "tasks.py").write_text("from fdl_tasks import ns\n")
        (root / "Cargo.toml").write_text("[package]\n")
        (root / "cluster.yaml").write_text(
            f"controller: {{path: {root}}}\n"
            "workers:\n  - {host: node-a, path: /mnt/p, arch: precompiled/cu128}\n"
        )
        yield root


def assert_clean_refusal(done: subprocess.CompletedProcess[str], project: Path) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("fdl: "), done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not list(project.rglob(f"*{MARKER}*"))
    assert not (project / "target").exists()
    return done.stderr


@pytest.mark.parametrize(
    "cmd",
    [
        f"x; touch {MARKER}",
        f"$(touch {MARKER})",
        "../../bin/sh",
        "-rf",
        "ddp bench",
        "ddp\nbench",
        "bench\x1b[31m",
    ],
)
def test_hostile_cmd_exits_1_with_one_message(cli_project: Path, cmd: str) -> None:
    stderr = assert_clean_refusal(inv(cli_project, "prebuild", f"--cmd={cmd}"), cli_project)
    assert stderr.startswith(f"fdl: command {cmd!r} is not a valid binary name")


@pytest.mark.parametrize(
    "crate", ["../outside", "/etc", f"a/$(touch {MARKER})", "a/../../b", "a//b"]
)
def test_hostile_crate_dir_exits_1_with_one_message(cli_project: Path, crate: str) -> None:
    done = inv(cli_project, "prebuild", "--cmd=ddp-bench", f"--crate-dir={crate}")
    stderr = assert_clean_refusal(done, cli_project)
    assert stderr.startswith(f"fdl: crate directory {crate!r} must be a relative path")
