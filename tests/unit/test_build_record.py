"""Build records: what a build read, by content (pure rules), the look and the units of a
real tree, the forced fingerprints, and the ``docker run`` identity. The rig tests
(tests/rig/test_freshness.py, test_everyday.py) run them through ``inv``."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs
import pytest

from fdl_tasks.build.backends.compose import NOT_INPUTS, service_inputs
from fdl_tasks.build.backends.docker_run import DockerRunBackend, user_inputs
from fdl_tasks.build.backends.native import native_identity
from fdl_tasks.build.build_environment import Build, BuildEnvironment, BuildJob
from fdl_tasks.build.build_record import (
    UNKNOWN,
    VERSION,
    BuildRecord,
    Freshness,
    RecordInputs,
    as_read,
    content_changed,
    reused_digest,
    tree_digest,
    verdict,
)
from fdl_tasks.build.build_record_io import Records
from fdl_tasks.build.build_results import JobResult, settled
from fdl_tasks.build.record_attempt import attempt_from, attempt_json
from fdl_tasks.build.record_files import attempt_file, record_file
from fdl_tasks.build.record_plan import MOUNT_BUDGET
from fdl_tasks.cargo.cargo_outputs import dep_info_paths, rerun_paths
from fdl_tasks.config.layout import MARKER_FILE
from fdl_tasks.config.model import Controller, DockerSettings
from fdl_tasks.core.binary_files import BinaryFacts, binary_facts, readable_facts
from fdl_tasks.publish.freshness import read_sources, sources_json, stale_binary, write_sources
from fdl_tasks.tree.snapshot import RACY_NS, Entry, Snapshot

S = 1_000_000_000
T = 1_700_000_000 * S
MAIN = "/p/src/main.rs"
LIB = "/p/util/src/lib.rs"
TREES = ("/p", "/p/libtorch/cu128")
UNITS = {"release/.fingerprint/ddp-bench-01": (MAIN,), "release/.fingerprint/util-02": (LIB,)}


def entry(**fields: object) -> Entry:
    base = Entry(False, 120, T, T, 7, 1, 0o100644, "aaa")
    return attrs.evolve(base, **fields)  # type: ignore[arg-type]


def look(entries: dict[str, Entry], taken_ns: int = T + 10 * S) -> Snapshot:
    return Snapshot(entries, frozenset({"/p", "/p/src", "/p/util/src"}), TREES, taken_ns)


BINARY = entry(size=4096, ino=99, digest=None)
FILES = {MAIN: entry(), LIB: entry(ino=8, digest="lll")}
RECORD = BuildRecord("id-1", look(FILES), UNITS, BINARY)


# ---------------------------------------------------------------------------- pure rules


def test_nothing_changed_is_fresh() -> None:
    assert verdict(RECORD, "id-1", look(FILES), BINARY) == attrs.evolve(
        verdict(RECORD, "id-1", look(FILES), BINARY), fresh=True, forced=(), changed=()
    )


@pytest.mark.parametrize(
    ("main", "why"),
    [
        (entry(digest="bbb"), "same stat, other content (a second save in the same second)"),
        (entry(mtime_ns=T - 3600 * S, ctime_ns=T + S, digest="bbb"), "mtime set back an hour"),
        (entry(ino=9, digest="bbb"), "deleted and recreated"),
        (None, "removed"),
    ],
)
def test_a_file_changed_by_content_forces_the_units_that_read_it(
    main: Entry | None, why: str
) -> None:
    now = look({**FILES, **({MAIN: main} if main else {})} if main else {LIB: FILES[LIB]})
    found = verdict(RECORD, "id-1", now, BINARY)
    assert not found.fresh, why
    assert found.forced == ("release/.fingerprint/ddp-bench-01",) and found.changed == (MAIN,)


def test_a_touched_file_with_the_same_content_is_no_change() -> None:
    now = look({**FILES, MAIN: entry(mtime_ns=T + 5 * S, ctime_ns=T + 5 * S)})
    assert verdict(RECORD, "id-1", now, BINARY).fresh


def test_a_unit_naming_a_directory_reads_its_tree() -> None:
    units = {"release/.fingerprint/proto-03": ("/p/protos",)}
    files = {"/p/protos": entry(is_dir=True, digest=None), "/p/protos/a/x.proto": entry()}
    record = BuildRecord("id-1", look(files), units, BINARY)
    now = look({**files, "/p/protos/a/x.proto": entry(digest="bbb")})
    assert verdict(record, "id-1", now, BINARY).forced == ("release/.fingerprint/proto-03",)


def test_other_changes_let_cargo_decide_without_forcing() -> None:
    for now, binary, identity in [
        (look({**FILES, "/p/README.md": entry(ino=11)}), BINARY, "id-1"),  # a file added
        (look(FILES), attrs.evolve(BINARY, mtime_ns=T + S), "id-1"),  # the binary touched
        (look(FILES), None, "id-1"),  # the binary gone
        (look(FILES), BINARY, "id-2"),  # another image or build line
        (look(FILES), BINARY, None),  # a mode that cannot name its inputs
        (Snapshot(FILES, frozenset({"/p", "/e"}), TREES, T), BINARY, "id-1"),  # a new listing
    ]:
        found = verdict(RECORD, identity, now, binary)
        assert not found.fresh and found.forced == ()


def test_a_file_looked_at_by_stat_alone_changes_with_its_stat() -> None:
    variant = entry(digest=None)
    assert content_changed(variant, attrs.evolve(variant, mtime_ns=T - S))
    assert not content_changed(variant, variant)
    assert content_changed(entry(digest=UNKNOWN), entry(digest=UNKNOWN))


def test_a_digest_is_kept_only_for_a_settled_unmoved_stat() -> None:
    old = entry()
    assert reused_digest(old, entry(digest=None), T + RACY_NS) == "aaa"
    assert reused_digest(old, entry(digest=None), T + S) is None  # racy when looked at
    assert reused_digest(old, entry(mtime_ns=T + 1000, digest=None), T + RACY_NS) is None
    assert reused_digest(None, entry(digest=None), T + RACY_NS) is None


def test_what_the_build_read_is_the_start_unless_the_stat_proves_it_unchanged() -> None:
    start = T + 10 * S
    before = look({MAIN: entry(), "/p/data.txt": entry(digest=None)}, start)
    after = look(
        {
            MAIN: entry(mtime_ns=start + S, ctime_ns=start + S, digest="new"),  # saved meanwhile
            "/p/data.txt": entry(),  # first named by this build; untouched since long
            "/p/gen.txt": entry(ctime_ns=start + S),  # written while the build ran
            "/p/old.txt": entry(ino=12),
        },
        start + 5 * S,
    )
    read = as_read(before, after)
    assert read.entries[MAIN] == entry()  # as the build started: the next build forces
    assert read.entries["/p/data.txt"].digest == "aaa"
    assert read.entries["/p/gen.txt"].digest == UNKNOWN
    assert read.entries["/p/old.txt"].digest == "aaa"
    assert read.taken_ns == start


def test_a_record_reads_back_and_anything_else_is_no_record() -> None:
    facts = BinaryFacts("f" * 64, (2, 34))
    for record in (
        RECORD,
        attrs.evolve(RECORD, identity=None),
        attrs.evolve(RECORD, built=facts),
        attrs.evolve(RECORD, built=attrs.evolve(facts, glibc=None)),
    ):
        assert BuildRecord.from_json(record.to_json()) == record
    built_text = attrs.evolve(RECORD, built=facts).to_json()
    assert BuildRecord.from_json(built_text.replace("[2, 34]", '["2", 34]')) is None
    assert BuildRecord.from_json(built_text.replace('"sha256"', '"sha"')) is None
    text = RECORD.to_json()
    for bad in (
        "",
        "{",
        "[]",
        text.replace(f'"version": {VERSION}', '"version": 2'),
        text[: len(text) // 2],
        text.replace('"units": {', '"units": {"x": 3, '),
    ):
        assert BuildRecord.from_json(bad) is None


def test_an_attempt_is_written_as_what_differs_from_its_record_and_read_back_whole() -> None:
    """An attempt's file holds only what differs from the record's look (a changed file,
    a new one, one gone): read over that record, it is the attempt's look exactly; over
    another record it is no attempt (a good build replaced that record since)."""
    new_file = "/p/src/new.rs"
    attempt = look({MAIN: entry(size=121, digest="bbb"), new_file: entry(ino=9)}, T + 20 * S)
    text = attempt_json(RECORD, attempt)
    assert set(json.loads(text)["entries"]) == {MAIN, new_file}
    assert json.loads(text)["gone"] == [LIB]
    assert attempt_from(text, RECORD) == attempt
    same = look(FILES, T + 30 * S)  # an attempt of a build that changed nothing it reads
    assert json.loads(attempt_json(RECORD, same))["entries"] == {}
    assert attempt_from(attempt_json(RECORD, same), RECORD) == same
    assert attempt_from(text, attrs.evolve(RECORD, serial="another")) is None
    for bad in ("", "[]", "{}", text.replace(f'"version": {VERSION}', '"version": 4'), text[:-9]):
        with pytest.raises(ValueError):
            attempt_from(bad, RECORD)


def test_the_tree_digest_follows_the_content_read() -> None:
    other = attrs.evolve(RECORD, look=look({**FILES, MAIN: entry(digest="bbb")}))
    assert tree_digest(RECORD) != tree_digest(other)
    touched = attrs.evolve(RECORD, look=look({**FILES, MAIN: entry(mtime_ns=T + S)}))
    assert tree_digest(RECORD) == tree_digest(touched)


def test_a_build_scripts_declarations_are_read_from_its_run_fingerprint() -> None:
    declared = {"local": [{"RerunIfChanged": {"output": "o", "paths": ["note.txt", "/a"]}}]}
    assert rerun_paths(json.dumps(declared)) == ["note.txt", "/a"]
    env_only = {"local": [{"RerunIfEnvChanged": {"var": "A", "val": None}}]}
    assert rerun_paths(json.dumps(env_only)) == []
    assert rerun_paths(json.dumps({"local": [{"Precalculated": "1"}]})) is None  # any file
    assert rerun_paths("{torn") == []


# ---------------------------------------------------------------------------- docker identity


@pytest.mark.parametrize(
    ("args", "mounts"),
    [
        ((), ()),
        (("--shm-size", "2g", "--network", "host", "-it", "-e", "A=1", "--env=B=2"), ()),
        (("-v", "/data:/in"), (("/in", "/data"),)),
        (("--volume=/r:/opt/r:ro", "-v/c:/opt/c"), (("/opt/r", "/r"), ("/opt/c", "/c"))),
        (("--volume", "/r:/opt/r"), (("/opt/r", "/r"),)),
        (("-v", "cache:/cache"), None),  # a named volume: its content is Docker's
        (("--mount", "type=bind,src=/d,dst=/d"), None),
        (("-e", "TOKEN"), None),  # taken from the client's environment
        (("-eTOKEN",), None),
        (("--env-file", "build.env"), None),
        (("--volumes-from=other",), None),
        (("-tv", "/a:/b"), None),  # short options run together: not taken apart here
        (("-te", "TOKEN"), None),
        (("-tv/host:/src",), None),  # -t -v /host:/src to Docker
        (("-teHTTP_PROXY",), None),
    ],
)
def test_the_users_mounts_and_what_no_record_can_see(
    args: tuple[str, ...], mounts: tuple[tuple[str, str], ...] | None
) -> None:
    found = user_inputs(args)
    assert (found.mounts if found else None) == mounts


def test_the_users_variables_are_read() -> None:
    found = user_inputs(("-e", "A=1", "--env=RUSTUP_HOME=/opt/rustup", "-eB=x=y"))
    assert found is not None and dict(found.env) == {
        "A": "1",
        "RUSTUP_HOME": "/opt/rustup",
        "B": "x=y",
    }


def test_dep_info_lists_every_file_once_with_spaces_escaped() -> None:
    text = (
        "/t/release/deps/x-1.d: src/main.rs /deps/with\\ space.rs /opt/libtorch/lib/l.so\n"
        "/t/release/deps/x-1: src/main.rs\n\nsrc/main.rs:\n# env-dep:A=b\n"
    )
    assert dep_info_paths(text) == ["src/main.rs", "/deps/with space.rs", "/opt/libtorch/lib/l.so"]


def docker_job(arch: str = "precompiled/cu128", timings: bool = False) -> BuildJob:
    environment = BuildEnvironment("docker", arch, ("cuda",), toolchain="img:12.8")
    build = Build(environment, "ddp-bench", "ddp-bench", timings=timings)
    return BuildJob("shared", build, ("a", "b"), "target/cluster/_shared/x")


def docker_backend(run_args: tuple[str, ...] = (), run_id: str = "r1") -> DockerRunBackend:
    docker = DockerSettings(image="img:12.8", run_args=run_args)
    backend = DockerRunBackend(Controller(path="/p", docker=docker), "c.yaml", run_id, None)
    backend.image_ids = {"img:12.8": "sha256:aaa"}
    return backend


def identity(backend: DockerRunBackend, job: BuildJob) -> str | None:
    return backend.record_inputs(job).identity


def test_the_docker_identity_is_the_image_and_the_line_without_the_run() -> None:
    job = docker_job()
    first, second = docker_backend(run_id="r1"), docker_backend(run_id="r2")
    found = identity(first, job)
    assert found is not None and found == identity(second, job)
    assert found.startswith("sha256:aaa ") and "r1" not in found
    assert "cargo build --release" in found and "--features cuda" in found
    second.image_ids = {"img:12.8": "sha256:bbb"}  # the tag now names another image
    assert identity(second, job) != found
    assert identity(first, docker_job(arch="precompiled/cu126")) != found


def test_the_docker_inputs_name_every_mount_and_a_rustup_home_apart() -> None:
    args = ("-v", "/root/.rustup:/opt/rustup:ro", "-v", "/root/.cargo:/opt/cargo:ro")
    backend = docker_backend((*args, "--env=RUSTUP_HOME=/opt/rustup"))
    inputs = backend.record_inputs(docker_job())
    assert inputs is not None
    assert inputs.mounts == (
        ("/workspace", "/p"),
        ("/opt/libtorch", None),
        ("/opt/rustup", "/root/.rustup"),
        ("/opt/cargo", "/root/.cargo"),
    )
    assert inputs.walked == ("/root/.cargo",) and inputs.rustup == ("/root/.rustup",)
    plain = docker_backend(args).record_inputs(docker_job())  # no RUSTUP_HOME: walked too
    assert plain is not None and plain.walked == ("/root/.rustup", "/root/.cargo")


def test_no_docker_identity_without_the_image_id_with_timings_or_unseen_inputs() -> None:
    unchecked = docker_backend()
    unchecked.image_ids = {}
    assert identity(unchecked, docker_job()) is None
    assert identity(docker_backend(), docker_job(timings=True)) is None
    unseen = docker_backend(("--env-file", "x")).record_inputs(docker_job())
    assert unseen.identity is None and unseen.mounts[0] == ("/workspace", "/p")


# ---------------------------------------------------------------------------- a real tree

CRATE = "ddp-bench"


def project(root: Path) -> BuildJob:
    """A workspace after one build: sources, a variant, the target dir's marker, binary
    and the units cargo left (main.rs's and the path dependency util's)."""
    job = docker_job()
    target = job.target_dir
    for name, text in {
        "Cargo.toml": '[workspace]\nmembers = ["ddp-bench", "util"]\n',
        "ddp-bench/Cargo.toml": '[package]\nname = "ddp-bench"\nversion = "0.1.0"\n',
        "ddp-bench/src/main.rs": "fn main() {}\n",
        "util/Cargo.toml": '[package]\nname = "util"\nversion = "0.1.0"\n',
        "util/src/lib.rs": "pub fn f() {}\n",
        "libtorch/precompiled/cu128/lib/libtorch.so": "v1",
        "libtorch/precompiled/cu126/lib/libtorch.so": "other variant",
        ".git/HEAD": "ref: refs/heads/main\n",
        f"{target}/{MARKER_FILE}": "{}",
        f"{target}/release/ddp-bench": "ELF",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    unit(root, job, "ddp-bench-0001", "ddp-bench/src/main.rs")
    unit(root, job, "util-0002", "util/src/lib.rs")
    settle(root)
    return job


def settle(root: Path) -> None:
    """Every file changed a minute ago: nothing racy unless a test makes it so."""
    old = time.time() - 60
    for path in root.rglob("*"):
        os.utime(path, (old, old))


def unit(root: Path, job: BuildJob, name: str, *paths: str, run: object = None) -> Path:
    """A unit's fingerprint dir and rustc's dep-info (paths relative to the workspace
    root, or absolute as the container saw them); ``run``: a build script run's local
    fingerprint instead."""
    profile = root / job.target_dir / "release"
    fingerprint = profile / ".fingerprint" / name
    fingerprint.mkdir(parents=True, exist_ok=True)
    if run is not None:
        (fingerprint / "run-build-script-build-script-build.json").write_text(
            json.dumps({"local": run})
        )
        return fingerprint
    (fingerprint / "lib-x").write_text("0")
    escaped = " ".join(p.replace(" ", "\\ ") for p in paths)
    (profile / "deps").mkdir(exist_ok=True)
    crate = name.rpartition("-")[0].replace("-", "_")
    (profile / "deps" / f"{name.replace(name.rpartition('-')[0], crate)}.d").write_text(
        f"/workspace/x: {escaped}\n"
    )
    return fingerprint


def records(
    root: Path,
    mounts: dict[str, str] | None = None,
    walked: tuple[str, ...] = (),
    rustup: tuple[str, ...] = (),
    identity: str | None = "id-1",
) -> Records:
    table = (("/workspace", str(root)), ("/opt/libtorch", None), *(mounts or {}).items())
    inputs = RecordInputs(identity, tuple(table), walked, rustup)
    return Records(root, lambda job: inputs)


def built(root: Path, job: BuildJob, keeper: Records | None = None) -> BuildRecord | None:
    """What a build step does: check, cargo (which writes the fingerprints the check
    removed again), record (returned)."""
    keeper = keeper or records(root)
    fingerprints = root / job.target_dir / "release/.fingerprint"
    kept = {p: p.read_bytes() for p in fingerprints.rglob("*") if p.is_file()}
    check = keeper.check(job)
    for path, content in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return keeper.record(job, check, readable_facts(root / job.built_binary))  # as the builder


def fingerprint(root: Path, job: BuildJob, name: str) -> Path:
    return root / job.target_dir / "release/.fingerprint" / name


def test_a_record_names_every_unit_and_what_it_read(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    record = BuildRecord.from_json(record_file(tmp_path, job).read_text())
    assert record is not None
    assert dict(record.units) == {
        "release/.fingerprint/ddp-bench-0001": (f"{tmp_path}/ddp-bench/src/main.rs",),
        "release/.fingerprint/util-0002": (f"{tmp_path}/util/src/lib.rs",),
    }
    assert record.look.entries[f"{tmp_path}/util/src/lib.rs"].digest not in (None, UNKNOWN)


def test_a_file_first_named_after_the_check_is_read_for_the_record(tmp_path: Path) -> None:
    """A unit of this build names a file the look before cargo did not read (``.git/HEAD``:
    the walk skips ``.git``): the record looks again and keeps it (its content unknown
    here: its stat is too recent to trust, so the next build rebuilds what read it); what
    the first look read stays as it was when the build started, whatever was saved since."""
    job = project(tmp_path)
    built(tmp_path, job)
    main = tmp_path / "ddp-bench/src/main.rs"
    main.write_text("fn main() { }\n")
    keeper = records(tmp_path)
    check = keeper.check(job)
    head = f"{tmp_path}/.git/HEAD"
    assert head not in check.reads and head not in check.look.entries
    unit(tmp_path, job, "ddp-bench-0001", "ddp-bench/src/main.rs", ".git/HEAD")  # cargo ran
    main.write_text("fn main() { g() }\n")  # saved while it ran
    record = keeper.record(job, check, None)
    assert record is not None
    assert record.look.entries[head].digest == UNKNOWN
    assert record.look.entries[str(main)] == check.look.entries[str(main)]
    assert "release/.fingerprint/ddp-bench-0001" in records(tmp_path).check(job).verdict.forced


def test_fresh_until_something_it_reads_changes(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    assert records(tmp_path).check(job).verdict.fresh
    (tmp_path / "target/cluster/_envelopes").mkdir(parents=True)  # the tool's own: no change
    (tmp_path / "target/cluster/_envelopes/ddp-bench.json").write_text("{}")
    (tmp_path / "libtorch/precompiled/cu126/lib/libtorch.so").write_text("another variant")
    assert records(tmp_path).check(job).verdict.fresh
    (tmp_path / "README.md").write_text("not read by cargo: cargo decides, nothing forced")
    check = records(tmp_path).check(job)
    assert not check.verdict.fresh and check.verdict.forced == ()
    assert record_file(tmp_path, job).exists()  # the last good build's, until the next
    assert fingerprint(tmp_path, job, "util-0002").is_dir()


def test_a_look_taken_ahead_is_the_checks_while_the_record_stays(tmp_path: Path) -> None:
    """Beside preflight, nothing written: the check takes that look (a save made after it
    is this run's to miss, as if made after the command started its builds), and the
    next run's check sees the save."""
    job = project(tmp_path)
    built(tmp_path, job)
    keeper = records(tmp_path)
    forced = fingerprint(tmp_path, job, "ddp-bench-0001")
    keeper.look_ahead(job)
    assert not attempt_file(record_file(tmp_path, job)).exists() and forced.is_dir()
    (tmp_path / "ddp-bench/src/main.rs").write_text("fn main() { saved_after(); }\n")
    assert keeper.check(job).verdict.fresh
    after = records(tmp_path).check(job)
    assert after.verdict.forced == ("release/.fingerprint/ddp-bench-0001",)
    assert not forced.exists()


def test_a_record_replaced_since_the_look_ahead_is_looked_at_again(tmp_path: Path) -> None:
    """Another run built meanwhile (the record's file is another): what the look ahead
    saw (a change, its unit forced) is dropped, and the check compares with the new
    record: nothing to force, cargo skipped."""
    job = project(tmp_path)
    built(tmp_path, job)
    (tmp_path / "ddp-bench/src/main.rs").write_text("fn main() { edited(); }\n")
    keeper = records(tmp_path)
    keeper.look_ahead(job)
    settle(tmp_path)
    built(tmp_path, job)  # the other run, under the project lock
    check = keeper.check(job)
    assert check.verdict.fresh, check.verdict
    assert fingerprint(tmp_path, job, "ddp-bench-0001").is_dir()


@pytest.mark.parametrize("back_ns", [1_000, -3600 * S], ids=["same-second", "an-hour-back"])
def test_a_content_change_removes_only_that_units_fingerprint(tmp_path: Path, back_ns: int) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    lib = tmp_path / "util/src/lib.rs"
    mtime = lib.stat().st_mtime_ns
    lib.write_text("pub fn g() {}\n")  # the same size
    os.utime(lib, ns=(mtime + back_ns, mtime + back_ns))
    check = records(tmp_path).check(job)
    assert check.verdict.forced == ("release/.fingerprint/util-0002",)
    assert not fingerprint(tmp_path, job, "util-0002").exists()
    assert fingerprint(tmp_path, job, "ddp-bench-0001").is_dir()
    assert (tmp_path / "util/src/lib.rs").stat().st_mtime_ns == mtime + back_ns  # untouched


def test_a_build_scripts_run_takes_its_package_with_it(tmp_path: Path) -> None:
    job = project(tmp_path)
    (tmp_path / "ddp-bench/note.txt").write_text("a")
    declared = [{"RerunIfChanged": {"output": "o", "paths": ["note.txt"]}}]
    unit(tmp_path, job, "ddp-bench-0003", run=declared)
    settle(tmp_path)
    built(tmp_path, job)
    (tmp_path / "ddp-bench/note.txt").write_text("b")
    os.utime(tmp_path / "ddp-bench/note.txt", (time.time() - 3600,) * 2)
    check = records(tmp_path).check(job)
    assert check.verdict.forced == ("release/.fingerprint/ddp-bench-0003",)
    assert not fingerprint(tmp_path, job, "ddp-bench-0001").exists()  # the same package
    assert fingerprint(tmp_path, job, "util-0002").is_dir()


def test_a_build_script_declaring_nothing_reads_its_whole_package(tmp_path: Path) -> None:
    job = project(tmp_path)
    unit(tmp_path, job, "util-0004", run=[{"Precalculated": "1"}])
    (tmp_path / "util/data.bin").write_text("1")
    settle(tmp_path)
    built(tmp_path, job)
    (tmp_path / "util/data.bin").write_text("2")
    os.utime(tmp_path / "util/data.bin", (time.time() - 3600,) * 2)
    assert "release/.fingerprint/util-0004" in records(tmp_path).check(job).verdict.forced


def test_no_record_forces_every_unit_that_read_the_project(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    record_file(tmp_path, job).write_text(record_file(tmp_path, job).read_text()[:40])  # torn
    check = records(tmp_path).check(job)
    assert not check.verdict.fresh and len(check.verdict.forced) == 2
    assert not fingerprint(tmp_path, job, "util-0002").exists()


def test_no_identity_still_forces_but_never_skips(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job, records(tmp_path, identity=None))
    assert not records(tmp_path, identity=None).check(job).verdict.fresh
    (tmp_path / "util/src/lib.rs").write_text("pub fn g() {}\n")
    check = records(tmp_path, identity=None).check(job)
    assert check.verdict.forced == ("release/.fingerprint/util-0002",)


def test_a_symlinked_source_is_read_through_its_link(tmp_path: Path) -> None:
    job = project(tmp_path)
    real = tmp_path / "shared/lib.rs"
    real.parent.mkdir()
    real.write_text("pub fn f() {}\n")
    (tmp_path / "util/src/lib.rs").unlink()
    (tmp_path / "util/src/lib.rs").symlink_to(real)
    settle(tmp_path)
    built(tmp_path, job)
    mtime = real.stat().st_mtime_ns
    real.write_text("pub fn g() {}\n")
    os.utime(real, ns=(mtime, mtime))
    assert records(tmp_path).check(job).verdict.forced == ("release/.fingerprint/util-0002",)


def test_a_deleted_or_rewritten_binary_is_rebuilt(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    binary = tmp_path / job.built_binary
    binary.write_text("ELF, another")
    assert not records(tmp_path).check(job).verdict.fresh
    built(tmp_path, job)
    binary.unlink()
    assert not records(tmp_path).check(job).verdict.fresh


def test_a_record_keeps_its_binarys_digest_and_glibc_need_while_its_stat_holds(
    tmp_path: Path,
) -> None:
    """A good build's record reads its binary once (what verification compares each host's
    copy with); a run that finds the build unchanged takes them from the record. A binary
    no ELF reader can read is recorded without them: verification reads it and says why."""
    job = project(tmp_path)
    binary = tmp_path / job.built_binary
    first = built(tmp_path, job)
    assert first is not None and first.built is None  # "ELF", a text: not an ELF file
    shutil.copyfile("/bin/true", binary)
    record = built(tmp_path, job)
    assert record is not None and record.built == binary_facts(binary)
    assert record.built.glibc is not None
    check = records(tmp_path).check(job)
    assert check.verdict.fresh and check.record is not None
    assert check.record.built == record.built


@pytest.mark.parametrize(
    ("mount", "named"),
    [
        ("/deps", "/deps/dep/src/lib.rs"),  # a path dependency mounted outside the project
        # -v /elsewhere:/workspace/vendor: Docker serves the path from the most specific
        # mount, not the project's, and so does the record
        ("/workspace/vendor", "/workspace/vendor/dep/src/lib.rs"),
    ],
)
def test_a_mounted_file_a_unit_names_counts(tmp_path: Path, mount: str, named: str) -> None:
    job = project(tmp_path / "p")
    source = tmp_path / "elsewhere/dep/src"
    source.mkdir(parents=True)
    (source / "lib.rs").write_text("pub fn f() {}\n")
    unit(tmp_path / "p", job, "dep-0009", named)
    settle(tmp_path)
    keeper = records(tmp_path / "p", {mount: str(tmp_path / "elsewhere")})
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).verdict.fresh
    (source / "lib.rs").write_text("pub fn g() {}\n")
    assert keeper.check(job).verdict.forced == ("release/.fingerprint/dep-0009",)


def test_a_declared_directory_is_walked_whole(tmp_path: Path) -> None:
    """``rerun-if-changed=/protos`` (mounted): cargo looks inside it, at any depth."""
    job = project(tmp_path / "p")
    protos = tmp_path / "protos/a/b"
    protos.mkdir(parents=True)
    (protos / "x.proto").write_text("message X {}\n")
    run = [{"RerunIfChanged": {"output": "o", "paths": ["/protos"]}}]
    unit(tmp_path / "p", job, "ddp-bench-0003", run=run)
    settle(tmp_path)
    keeper = records(tmp_path / "p", {"/protos": str(tmp_path / "protos")})
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).verdict.fresh
    (protos / "x.proto").write_text("message Y {}\n")
    assert keeper.check(job).verdict.forced == ("release/.fingerprint/ddp-bench-0003",)


def test_a_declared_path_under_git_counts(tmp_path: Path) -> None:
    """``.git`` is never walked, but a build script's ``rerun-if-changed=.git/HEAD`` is
    (relative to its package: here the workspace's root package)."""
    job = project(tmp_path)
    (tmp_path / "ddp-bench/.git").mkdir()
    (tmp_path / "ddp-bench/.git/HEAD").write_text("ref: a\n")
    run = [{"RerunIfChanged": {"output": "o", "paths": [".git/HEAD"]}}]
    unit(tmp_path, job, "ddp-bench-0003", run=run)
    settle(tmp_path)
    built(tmp_path, job)
    assert records(tmp_path).check(job).verdict.fresh
    (tmp_path / "ddp-bench/.git/HEAD").write_text("ref: b\n")
    assert records(tmp_path).check(job).verdict.forced == ("release/.fingerprint/ddp-bench-0003",)


def test_a_mounted_file_and_a_mounted_tree_count(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    config = tmp_path / "home/config.toml"
    tree = tmp_path / "tools/a/b/c"
    tree.mkdir(parents=True)
    config.parent.mkdir()
    config.write_text("[build]\n")
    (tree / "deep.txt").write_text("1")
    walked = (str(config), str(tmp_path / "tools"))
    keeper = records(tmp_path / "p", walked=walked)
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).verdict.fresh
    config.write_text("[build]\nrustflags = ['-Ctarget-cpu=native']\n")
    assert not keeper.check(job).verdict.fresh
    built(tmp_path / "p", job, keeper)
    (tree / "deep.txt").write_text("2")  # four levels down
    assert not keeper.check(job).verdict.fresh


def test_a_mount_too_big_to_walk_never_skips_cargo(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    big = tmp_path / "big"
    big.mkdir()
    for n in range(MOUNT_BUDGET + 1):
        (big / str(n)).touch()
    keeper = records(tmp_path / "p", walked=(str(big),))
    built(tmp_path / "p", job, keeper)
    assert not keeper.check(job).verdict.fresh


def test_a_rustup_home_is_seen_by_what_an_update_rewrites(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    rustup = tmp_path / "rustup"
    (rustup / "update-hashes").mkdir(parents=True)
    (rustup / "update-hashes/stable").write_text("aaa")
    rustlib = rustup / "toolchains/stable/lib/rustlib"
    rustlib.mkdir(parents=True)
    (rustlib / "multirust-channel-manifest.toml").write_text("date = 1")
    keeper = records(tmp_path / "p", rustup=(str(rustup),))
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).verdict.fresh
    (rustup / "update-hashes/stable").write_text("bbb")
    assert not keeper.check(job).verdict.fresh
    built(tmp_path / "p", job, keeper)
    (rustlib / "multirust-channel-manifest.toml").write_text("date = 2")
    assert not keeper.check(job).verdict.fresh
    built(tmp_path / "p", job, keeper)
    (rustup / "toolchains/nightly/lib/rustlib").mkdir(parents=True)  # a new Rust release
    assert not keeper.check(job).verdict.fresh


def test_the_look_takes_the_earlier_clock(tmp_path: Path) -> None:
    """A target mount whose clock runs ahead must not make other files look settled."""
    job = project(tmp_path)
    built(tmp_path, job)
    marker = tmp_path / job.target_dir / MARKER_FILE
    ahead = time.time_ns() + 3600 * S
    os.utime(marker, ns=(ahead, ahead))
    main = tmp_path / "ddp-bench/src/main.rs"
    main.write_text("fn main() {1}\n")  # just now: racy by this machine's clock
    check = records(tmp_path).check(job)
    assert check.look.taken_ns < ahead and check.look.entries[str(main)].digest is not None


def test_torn_or_foreign_files_are_no_record_and_no_crash(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    record_file(tmp_path, job).write_bytes(b"\xff\xfe not utf-8")
    assert records(tmp_path).check(job).verdict == Freshness(
        False, ("release/.fingerprint/ddp-bench-0001", "release/.fingerprint/util-0002")
    )
    deps = tmp_path / job.target_dir / "release/deps"
    (deps / "ddp_bench-0001.d").write_bytes(b"\xff\xfe: \xfe")
    assert records(tmp_path).check(job).look is not None  # no crash


def test_an_unreadable_source_is_compared_by_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root every file can be read, so the refusal is simulated."""
    job = project(tmp_path)
    built(tmp_path, job)
    monkeypatch.setattr("fdl_tasks.tree.scan.digest", lambda path: None)
    lib = tmp_path / "util/src/lib.rs"
    assert records(tmp_path).check(job).verdict.fresh  # unmoved: its digest is kept
    lib.write_text("pub fn g() {}\n")
    assert records(tmp_path).check(job).verdict.forced == ("release/.fingerprint/util-0002",)


def test_a_second_commands_first_build_compares_with_the_first_commands_record(
    tmp_path: Path,
) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    second = attrs.evolve(job, build=attrs.evolve(job.build, command="ddp-eval"))
    check = records(tmp_path).check(second)
    assert check.verdict == Freshness(False)  # no unit forced; cargo builds what it adds
    (tmp_path / "util/src/lib.rs").write_text("pub fn g() {}\n")
    assert records(tmp_path).check(second).verdict.forced == ("release/.fingerprint/util-0002",)


# ---------------------------------------------------------------------------- native identity


def test_the_native_identity_follows_the_rust_release_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "cargo-home"))
    first = native_identity(str(tmp_path))
    assert first is not None and "rustc" in first
    monkeypatch.setenv("PWD", "/elsewhere")  # a shell's own: no change
    monkeypatch.setenv("FLODL_INTERNAL_PREBUILD_PER_HOST", "{}")  # handed over: no change
    assert native_identity(str(tmp_path)) == first
    monkeypatch.setenv("RUSTFLAGS", "-Ctarget-cpu=native")
    assert native_identity(str(tmp_path)) != first
    (tmp_path / "cargo-home").mkdir()
    (tmp_path / "cargo-home/config.toml").write_text("[build]\njobs = 1\n")
    with_config = native_identity(str(tmp_path))
    assert with_config is not None and "jobs = 1" in with_config
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))
    assert native_identity(str(tmp_path)) is None  # no Rust to ask: cargo decides


# ---------------------------------------------------------------------------- provenance


def test_the_sidecar_reads_back_and_anything_else_names_no_host() -> None:
    sources = {"a": ("target/cluster/_shared/x/.fdl-record-c.json", "d1")}
    assert read_sources(sources_json(sources)) == sources
    for bad in ("", "{", "[]", '{"version": 3, "hosts": {"a": 1}}', '{"hosts": {}}'):
        assert read_sources(bad) == {}


def test_a_stale_binary_is_named_with_the_file_that_changed(tmp_path: Path) -> None:
    job = project(tmp_path)
    record = built(tmp_path, job)
    assert record is not None
    result = JobResult(job=job, ok=True, seconds=1.0, tree=tree_digest(record))
    write_sources(tmp_path, "ddp-bench", [result], set())
    assert stale_binary(tmp_path, "ddp-bench", ["a", "b", "c"]) is None
    lib = tmp_path / "util/src/lib.rs"
    mtime = lib.stat().st_mtime_ns
    lib.write_text("pub fn g() {}\n")
    os.utime(lib, ns=(mtime, mtime))
    assert stale_binary(tmp_path, "ddp-bench", ["a"]) == (
        "a's binary of ddp-bench was built before util/src/lib.rs changed: run inv prebuild "
        "--cmd ddp-bench (or launch it anyway with --stale-ok)"
    )
    assert stale_binary(tmp_path, "ddp-bench", ["c"]) is None  # not a host of that build
    built(tmp_path, job)  # a later build, not published
    assert "other sources than its target dir's last build" in str(
        stale_binary(tmp_path, "ddp-bench", ["b"])
    )


def test_a_build_that_did_not_end_well_is_compared_with_too(tmp_path: Path) -> None:
    """A build started for a change, compiled it and failed (or was killed); the change is
    then undone with the old mtime (``cp -p`` of a backup): the unit holds what the failed
    build compiled, so it is rebuilt, and nothing is fresh until a build ends well."""
    job = project(tmp_path)
    built(tmp_path, job)
    lib = tmp_path / "util/src/lib.rs"
    original, mtime = lib.read_text(), lib.stat().st_mtime_ns
    lib.write_text("pub fn g() {}\n")
    assert records(tmp_path).check(job).verdict.forced == ("release/.fingerprint/util-0002",)
    unit(tmp_path, job, "util-0002", "util/src/lib.rs")  # cargo compiled it, then failed
    lib.write_text(original)
    os.utime(lib, ns=(mtime, mtime))
    check = records(tmp_path).check(job)
    assert check.verdict == Freshness(False, ("release/.fingerprint/util-0002",), (str(lib),))
    built(tmp_path, job)  # a build that ends well
    assert records(tmp_path).check(job).verdict.fresh


def test_an_attempt_leaves_the_record_as_it_is_and_goes_with_the_next_good_build(
    tmp_path: Path,
) -> None:
    """The check of a build that must run writes its look beside the record, not into it
    (the record's bytes stay); a good build removes it; one left over a record replaced
    since is not read; one that cannot be read leaves no record to trust."""
    job = project(tmp_path)
    built(tmp_path, job)
    path = record_file(tmp_path, job)
    kept = path.read_bytes()
    (tmp_path / "util/src/lib.rs").write_text("pub fn g() {}\n")
    records(tmp_path).check(job)
    assert path.read_bytes() == kept and attempt_file(path).is_file()
    left = attempt_file(path).read_bytes()
    unit(tmp_path, job, "util-0002", "util/src/lib.rs")  # cargo compiled it
    built(tmp_path, job)
    assert not attempt_file(path).exists()
    attempt_file(path).write_bytes(left)  # of the record before: that build compared with it
    assert records(tmp_path).check(job).verdict.fresh
    attempt_file(path).write_text("{")
    check = records(tmp_path).check(job)
    assert not check.verdict.fresh and len(check.verdict.forced) == 2


# ---------------------------------------------------------------------------- compose services

SERVICE: dict[str, Any] = {
    "image": "flodl-cuda:12.8",
    "volumes": [
        {"type": "bind", "source": "/srv/proj", "target": "/workspace"},
        {"type": "bind", "source": "/srv/proj/libtorch/precompiled/cu128", "target": "/lt"},
        {"type": "bind", "source": "/root/.rustup", "target": "/opt/rustup", "read_only": True},
        "/root/.cargo:/opt/cargo:ro",  # docker-compose v1 prints the short form
    ],
    "environment": {"RUSTUP_HOME": "/opt/rustup", "FLODL_INTERNAL_PREBUILD_PER_HOST": "{}"},
}


def compose_inputs(
    service: dict[str, object], image: str | None = "sha256:1"
) -> RecordInputs | None:
    variant = "/srv/proj/libtorch/precompiled/cu128"
    return service_inputs(service, image, "/srv/proj", variant, "docker compose run … cuda")


def test_a_compose_service_s_binds_are_what_its_record_looks_at() -> None:
    inputs = compose_inputs(SERVICE)
    assert inputs is not None and inputs.identity is not None
    assert inputs.identity.startswith("sha256:1 ")
    assert ("/workspace", "/srv/proj") in inputs.mounts and ("/lt", None) in inputs.mounts
    assert inputs.rustup == ("/root/.rustup",)  # an update's files, not a walk
    assert inputs.walked == ("/root/.cargo",)


def test_a_compose_identity_changes_with_the_service_not_with_the_envelope() -> None:
    published = {**SERVICE, "environment": {**SERVICE["environment"], NOT_INPUTS[0]: '{"a":{}}'}}
    changed = {**SERVICE, "environment": {**SERVICE["environment"], "RUSTFLAGS": "-C x"}}
    first, same, other = (compose_inputs(s) for s in (SERVICE, published, changed))
    assert first is not None and same is not None and other is not None
    assert first.identity == same.identity != other.identity
    newer = compose_inputs(SERVICE, "sha256:2")
    assert newer is not None and newer.identity != first.identity


@pytest.mark.parametrize(
    "volume", ["cargo-cache:/usr/local/cargo", {"type": "volume", "source": "x", "target": "/x"}]
)
def test_a_compose_service_reading_what_no_record_sees_has_no_identity(volume: object) -> None:
    assert compose_inputs({**SERVICE, "volumes": [*SERVICE["volumes"], volume]}) is None
    assert compose_inputs(SERVICE, image=None) is None


def test_a_result_settles_when_its_record_is_written(tmp_path: Path) -> None:
    """The builder hands a build's result on while its record is still being written (beside
    verification's round trip); settling waits for it and takes the tree digest from it."""
    job = project(tmp_path)
    record = built(tmp_path, job)
    assert record is not None
    writing: Future[BuildRecord | None] = Future()
    pending = JobResult(job=job, ok=True, seconds=1.0, recording=writing)
    failed: Future[BuildRecord | None] = Future()
    unwritten = JobResult(job=job, ok=True, seconds=1.0, recording=failed)
    kept = JobResult(job=job, ok=True, seconds=1.0, tree="kept")
    threading.Timer(0.2, writing.set_result, (record,)).start()
    failed.set_result(None)  # no record written: no tree to name
    first, second, third = settled([pending, unwritten, kept])
    assert writing.done() and first.tree == tree_digest(record) != ""
    assert (second.tree, third.tree) == ("", "kept")
    assert first.recording is None and second.recording is None
