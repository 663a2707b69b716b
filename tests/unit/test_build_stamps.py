"""Build stamps: when a build may skip cargo (pure rules), the look at a real tree, and the
``docker run`` identity. The rig test (tests/rig/test_everyday.py) runs them through ``inv``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
import pytest

from fdl_tasks.backends.docker_run import DockerRunBackend, user_inputs
from fdl_tasks.build_environment import Build, BuildEnvironment, BuildJob
from fdl_tasks.build_stamps import (
    VERSION,
    BuildStamp,
    StampInputs,
    dep_info_paths,
    stamp_after_build,
    up_to_date,
)
from fdl_tasks.layout import MARKER_FILE
from fdl_tasks.model import Controller, DockerSettings
from fdl_tasks.stamp_files import MOUNT_BUDGET, Stamps, stamp_file
from fdl_tasks.watch.snapshot import RACY_NS, Entry, Snapshot

S = 1_000_000_000
T = 1_700_000_000 * S
MAIN = "/p/src/main.rs"
TREES = ("/p", "/p/libtorch/cu128")


def entry(**fields: object) -> Entry:
    return attrs.evolve(Entry(False, 120, T, T, 7, 1, 0o100644), **fields)  # type: ignore[arg-type]


def look(entries: dict[str, Entry], taken_ns: int = T + 10 * S) -> Snapshot:
    return Snapshot(entries, frozenset({"/p", "/p/src"}), TREES, taken_ns)


BINARY = entry(size=4096, ino=99)
STAMP = stamp_after_build("id-1", look({MAIN: entry()}), BINARY)


# ---------------------------------------------------------------------------- pure rules


def test_nothing_changed_is_up_to_date() -> None:
    assert up_to_date(STAMP, "id-1", look({MAIN: entry()}), BINARY)


@pytest.mark.parametrize(
    "now",
    [
        look({MAIN: entry(mtime_ns=T + S)}),  # saved again
        look({MAIN: entry(ctime_ns=T + 1)}),  # rewritten, the mtime set back
        look({MAIN: entry(ino=8)}),  # replaced by a rename (an editor's save)
        look({}),  # removed
        look({MAIN: entry(), "/p/src/new.rs": entry(ino=9)}),  # a file added
        Snapshot({MAIN: entry()}, frozenset({"/p", "/p/src"}), (*TREES, "/d"), T),  # a new tree
        Snapshot({MAIN: entry()}, frozenset({"/p", "/p/src", "/e"}), TREES, T),  # a new list
    ],
    ids=["mtime", "ctime", "inode", "removed", "added", "tree", "listed"],
)
def test_any_change_of_what_the_build_read_is_not_up_to_date(now: Snapshot) -> None:
    assert not up_to_date(STAMP, "id-1", now, BINARY)


def test_another_identity_a_touched_binary_or_no_stamp_is_not_up_to_date() -> None:
    now = look({MAIN: entry()})
    assert not up_to_date(STAMP, "id-2", now, BINARY)
    assert not up_to_date(STAMP, None, now, BINARY)
    assert not up_to_date(STAMP, "id-1", now, attrs.evolve(BINARY, mtime_ns=T + S))
    assert not up_to_date(STAMP, "id-1", now, None)  # the binary is gone
    assert not up_to_date(None, "id-1", now, BINARY)


def test_a_racy_stat_is_settled_by_content() -> None:
    """Saved in the tick of the look before cargo: the stat alone proves nothing, so the
    stamp keeps the digest and a same-stat file with other content is a change."""
    before = look({MAIN: entry(digest="aaa")}, taken_ns=T + S // 2)
    stamp = stamp_after_build("id-1", before, BINARY)
    assert stamp.inputs.entries[MAIN].digest == "aaa"  # still racy when taken: kept
    assert up_to_date(stamp, "id-1", look({MAIN: entry(digest="aaa")}), BINARY)
    assert not up_to_date(stamp, "id-1", look({MAIN: entry(digest="bbb")}), BINARY)


def test_a_settled_stat_keeps_no_digest() -> None:
    before = look({MAIN: entry(digest="aaa")}, taken_ns=T + RACY_NS)
    assert stamp_after_build("id-1", before, BINARY).inputs.entries[MAIN].digest is None


def test_a_stamp_reads_back_and_anything_else_is_no_stamp() -> None:
    racy = stamp_after_build("id-1", look({MAIN: entry(digest="aaa")}, T + S), BINARY)
    for stamp in (STAMP, racy):
        assert BuildStamp.from_json(stamp.to_json()) == stamp
    text = STAMP.to_json()
    for bad in ("", "{", "[]", text.replace(f'"version": {VERSION}', '"version": 0'), text[:-9]):
        assert BuildStamp.from_json(bad) is None


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
def test_the_users_mounts_and_what_no_stamp_can_see(
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


def test_dep_info_lists_every_file_with_spaces_escaped() -> None:
    text = "/t/release/x: /w/src/main.rs /deps/with\\ space.rs /opt/libtorch/lib/l.so\n\n"
    assert dep_info_paths(text) == [
        "/w/src/main.rs",
        "/deps/with space.rs",
        "/opt/libtorch/lib/l.so",
    ]


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
    inputs = backend.stamp_inputs(job)
    return inputs.identity if inputs else None


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
    inputs = backend.stamp_inputs(docker_job())
    assert inputs is not None
    assert inputs.mounts == (
        ("/workspace", "/p"),
        ("/opt/libtorch", None),
        ("/opt/rustup", "/root/.rustup"),
        ("/opt/cargo", "/root/.cargo"),
    )
    assert inputs.walked == ("/root/.cargo",) and inputs.rustup == ("/root/.rustup",)
    plain = docker_backend(args).stamp_inputs(docker_job())  # no RUSTUP_HOME: walked too
    assert plain is not None and plain.walked == ("/root/.rustup", "/root/.cargo")


def test_no_docker_inputs_without_the_image_id_with_timings_or_unseen_inputs() -> None:
    unchecked = docker_backend()
    unchecked.image_ids = {}
    assert unchecked.stamp_inputs(docker_job()) is None
    assert docker_backend().stamp_inputs(docker_job(timings=True)) is None
    assert docker_backend(("--env-file", "x")).stamp_inputs(docker_job()) is None


# ---------------------------------------------------------------------------- a real tree


def project(root: Path) -> BuildJob:
    """A project after one build: sources, a variant, the target dir's marker and binary."""
    job = docker_job()
    for name, text in {
        "Cargo.toml": '[package]\nname = "ddp-bench"\nversion = "0.1.0"\n',
        "src/main.rs": "fn main() {}\n",
        "libtorch/precompiled/cu128/lib/libtorch.so": "v1",
        "libtorch/precompiled/cu126/lib/libtorch.so": "other variant",
        ".git/HEAD": "ref: refs/heads/main\n",
        f"{job.target_dir}/{MARKER_FILE}": "{}",
        f"{job.target_dir}/release/ddp-bench": "ELF",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    old = time.time() - 60  # settled: nothing racy unless a test makes it so
    for path in root.rglob("*"):
        os.utime(path, (old, old))
    return job


def stamps(
    root: Path,
    mounts: dict[str, str] | None = None,
    walked: tuple[str, ...] = (),
    rustup: tuple[str, ...] = (),
) -> Stamps:
    table = (("/workspace", str(root)), ("/opt/libtorch", None), *(mounts or {}).items())
    inputs = StampInputs("id-1", tuple(table), walked, rustup)
    return Stamps(root, lambda job: inputs)


def built(root: Path, job: BuildJob, keeper: Stamps | None = None) -> None:
    """What a build step does: check, (cargo), record."""
    keeper = keeper or stamps(root)
    check = keeper.check(job)
    keeper.record(job, check)


def test_a_rebuilt_tree_is_up_to_date_until_something_it_reads_changes(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    assert stamp_file(tmp_path, job).is_file()
    assert stamps(tmp_path).check(job).fresh
    (tmp_path / "target/cluster/_envelopes").mkdir(parents=True)  # the tool's own: no change
    (tmp_path / "target/cluster/_envelopes/ddp-bench.json").write_text("{}")
    (tmp_path / "libtorch/precompiled/cu126/lib/libtorch.so").write_text("another variant")
    assert stamps(tmp_path).check(job).fresh
    (tmp_path / "src/main.rs").write_text("fn main() { }\n")
    assert not stamps(tmp_path).check(job).fresh
    assert not stamp_file(tmp_path, job).exists()  # removed before cargo runs


@pytest.mark.parametrize(
    "change",
    [
        "libtorch/precompiled/cu128/lib/libtorch.so",  # the build's own variant
        "build.rs",  # a new file anywhere in the project
        "README.md",  # not a source cargo tracks: counted all the same
    ],
)
def test_the_variant_and_any_project_file_count(tmp_path: Path, change: str) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    (tmp_path / change).write_text("changed")
    assert not stamps(tmp_path).check(job).fresh


def test_a_declared_path_under_git_counts(tmp_path: Path) -> None:
    """``.git`` is never walked, but a build script's ``rerun-if-changed=.git/HEAD`` is."""
    job = project(tmp_path)
    build_output(tmp_path, job, "ddp-bench-0123", "cargo:rerun-if-changed=.git/HEAD\n")
    built(tmp_path, job)
    (tmp_path / ".git/config").write_text("[core]\n")  # beside it: not declared, yet listed
    assert not stamps(tmp_path).check(job).fresh
    built(tmp_path, job)
    assert stamps(tmp_path).check(job).fresh
    (tmp_path / ".git/HEAD").write_text("ref: refs/heads/next\n")
    assert not stamps(tmp_path).check(job).fresh


def test_a_deleted_or_rewritten_binary_is_rebuilt(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    binary = tmp_path / job.built_binary
    binary.write_text("ELF, another")
    assert not stamps(tmp_path).check(job).fresh
    built(tmp_path, job)
    binary.unlink()
    assert not stamps(tmp_path).check(job).fresh


def test_no_identity_never_reads_or_writes_a_stamp(tmp_path: Path) -> None:
    job = project(tmp_path)
    keeper = Stamps(tmp_path, lambda job: None)
    check = keeper.check(job)
    keeper.record(job, check)
    assert not check.fresh and not stamp_file(tmp_path, job).exists()


def build_output(root: Path, job: BuildJob, unit: str, text: str) -> None:
    """What a build script printed, where cargo keeps it (``release/build/<unit>/output``)."""
    output = root / job.target_dir / "release/build" / unit / "output"
    output.parent.mkdir(parents=True)
    output.write_text(text)


def dep_info(root: Path, job: BuildJob, *paths: str) -> None:
    """What cargo writes beside the binary: the binary, then every file it depends on."""
    escaped = " ".join(p.replace(" ", "\\ ") for p in paths)
    (root / f"{job.built_binary}.d").write_text(f"/workspace/{job.built_binary}: {escaped}\n")


@pytest.mark.parametrize(
    ("mount", "named"),
    [
        ("/deps", "/deps/dep/src/lib.rs"),  # a path dependency mounted outside the project
        # -v /elsewhere:/workspace/vendor: Docker serves the path from the most specific
        # mount, not the project's, and so does the look
        ("/workspace/vendor", "/workspace/vendor/dep/src/lib.rs"),
    ],
)
def test_a_mounted_file_the_dep_info_names_counts(tmp_path: Path, mount: str, named: str) -> None:
    """The dep-info names the file in the container's view; the look lists its directory
    on the controller."""
    job = project(tmp_path / "p")
    source = tmp_path / "elsewhere/dep/src"
    source.mkdir(parents=True)
    (source / "lib.rs").write_text("pub fn f() {}\n")
    dep_info(tmp_path / "p", job, "/workspace/src/main.rs", named)
    keeper = stamps(tmp_path / "p", {mount: str(tmp_path / "elsewhere")})
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    (source / "lib.rs").write_text("pub fn f() { }\n")
    assert not keeper.check(job).fresh


def test_what_a_first_build_reveals_is_compared_from_the_next_build_on(tmp_path: Path) -> None:
    """The look before a first build cannot know the dep-info that build writes: the stamp
    it leaves covers less than the next look, so it is never fresh."""
    job = project(tmp_path / "p")
    deps = tmp_path / "shared-lib/src"
    deps.mkdir(parents=True)
    (deps / "lib.rs").write_text("pub fn f() {}\n")
    keeper = stamps(tmp_path / "p", {"/deps": str(tmp_path / "shared-lib")})
    check = keeper.check(job)  # before cargo: no dep-info yet
    dep_info(tmp_path / "p", job, "/workspace/src/main.rs", "/deps/src/lib.rs")  # cargo ran
    keeper.record(job, check)
    (deps / "lib.rs").write_text("pub fn f() { }\n")  # never seen by a look before
    assert not keeper.check(job).fresh
    built(tmp_path / "p", job, keeper)  # the next build's look covers it
    assert keeper.check(job).fresh


@pytest.mark.parametrize(
    "named",
    [
        "/workspace/src/shared/lib.rs",  # through a link that dangles on the controller
        "/deps/gone.rs",  # a mounted file that is not there
        "src/relative.rs",  # dep-info written relative to a base dir
    ],
)
def test_a_named_file_the_look_cannot_find_is_never_fresh(tmp_path: Path, named: str) -> None:
    job = project(tmp_path / "p")
    (tmp_path / "p/src/shared").symlink_to(tmp_path / "nowhere")
    (tmp_path / "deps").mkdir()
    dep_info(tmp_path / "p", job, "/workspace/src/main.rs", named)
    keeper = stamps(tmp_path / "p", {"/deps": str(tmp_path / "deps")})
    built(tmp_path / "p", job, keeper)
    assert not keeper.check(job).fresh
    assert not stamp_file(tmp_path / "p", job).exists()


def test_a_declared_directory_is_walked_whole(tmp_path: Path) -> None:
    """``rerun-if-changed=/protos`` (mounted): cargo looks inside it, at any depth."""
    job = project(tmp_path / "p")
    protos = tmp_path / "protos/a/b"
    protos.mkdir(parents=True)
    (protos / "x.proto").write_text("message X {}\n")
    build_output(tmp_path / "p", job, "ddp-bench-0123", "cargo:rerun-if-changed=/protos\n")
    keeper = stamps(tmp_path / "p", {"/protos": str(tmp_path / "protos")})
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    (protos / "x.proto").write_text("message Y {}\n")
    assert not keeper.check(job).fresh


def test_a_mounted_file_and_a_mounted_tree_count(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    config = tmp_path / "home/config.toml"
    tree = tmp_path / "tools/a/b/c"
    tree.mkdir(parents=True)
    config.parent.mkdir()
    config.write_text("[build]\n")
    (tree / "deep.txt").write_text("1")
    walked = (str(config), str(tmp_path / "tools"))
    keeper = stamps(tmp_path / "p", walked=walked)
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    config.write_text("[build]\nrustflags = ['-Ctarget-cpu=native']\n")
    assert not keeper.check(job).fresh
    built(tmp_path / "p", job, keeper)
    (tree / "deep.txt").write_text("2")  # four levels down
    assert not keeper.check(job).fresh


def test_a_mount_too_big_to_walk_means_no_stamp(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    big = tmp_path / "big"
    big.mkdir()
    for n in range(MOUNT_BUDGET + 1):
        (big / str(n)).touch()
    keeper = stamps(tmp_path / "p", walked=(str(big),))
    built(tmp_path / "p", job, keeper)
    assert not keeper.check(job).fresh and not stamp_file(tmp_path / "p", job).exists()


def test_a_rustup_home_is_seen_by_what_an_update_rewrites(tmp_path: Path) -> None:
    job = project(tmp_path / "p")
    rustup = tmp_path / "rustup"
    (rustup / "update-hashes").mkdir(parents=True)
    (rustup / "update-hashes/stable").write_text("aaa")
    rustlib = rustup / "toolchains/stable/lib/rustlib"
    rustlib.mkdir(parents=True)
    (rustlib / "multirust-channel-manifest.toml").write_text("date = 1")
    keeper = stamps(tmp_path / "p", rustup=(str(rustup),))
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    (rustup / "update-hashes/stable").write_text("bbb")
    assert not keeper.check(job).fresh
    built(tmp_path / "p", job, keeper)
    (rustlib / "multirust-channel-manifest.toml").write_text("date = 2")
    assert not keeper.check(job).fresh
    built(tmp_path / "p", job, keeper)
    (rustup / "toolchains/nightly/lib/rustlib").mkdir(parents=True)  # a new toolchain
    assert not keeper.check(job).fresh


def test_the_look_takes_the_earlier_clock(tmp_path: Path) -> None:
    """A target mount whose clock runs ahead must not make other files look settled."""
    job = project(tmp_path)
    marker = tmp_path / job.target_dir / MARKER_FILE
    ahead = time.time_ns() + 3600 * S
    os.utime(marker, ns=(ahead, ahead))
    main = tmp_path / "src/main.rs"
    main.write_text("fn main() {1}\n")  # just now: racy by this machine's clock
    look = stamps(tmp_path).check(job).look
    assert look is not None and look.entries[str(main)].digest is not None


@pytest.mark.parametrize(
    ("declared", "file"),
    [
        ("/deps/foo/.git/HEAD", ".git/HEAD"),  # the mount's walk skips .git: listed anyway
        (".cfg/build.txt", ".cfg/build.txt"),  # relative to the mounted package's directory
    ],
)
def test_a_mounted_packages_declaration_counts(tmp_path: Path, declared: str, file: str) -> None:
    """A path dependency ``foo`` mounted from outside the project; its build script declares
    a file inside a hidden directory."""
    job = project(tmp_path / "p")
    foo = tmp_path / "deps/foo"
    (foo / file).parent.mkdir(parents=True)
    (foo / "Cargo.toml").write_text('[package]\nname = "foo"\nversion = "0.1.0"\n')
    (foo / file).write_text("1")
    build_output(tmp_path / "p", job, "foo-0123", f"cargo:rerun-if-changed={declared}\n")
    keeper = stamps(tmp_path / "p", {"/deps": str(tmp_path / "deps")}, (str(tmp_path / "deps"),))
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    (foo / file).write_text("2")
    assert not keeper.check(job).fresh
    (foo / file).unlink()  # cargo reruns on a missing declaration every time
    built(tmp_path / "p", job, keeper)
    assert not keeper.check(job).fresh


def test_torn_or_foreign_files_are_no_stamp_and_no_crash(tmp_path: Path) -> None:
    job = project(tmp_path)
    built(tmp_path, job)
    stamp_file(tmp_path, job).write_bytes(b"\xff\xfe not utf-8")
    assert not stamps(tmp_path).check(job).fresh
    (tmp_path / f"{job.built_binary}.d").write_bytes(b"\xff\xfe: \xfe")
    built(tmp_path, job)
    assert not stamps(tmp_path).check(job).fresh and not stamp_file(tmp_path, job).exists()


def test_a_named_file_whose_directory_cannot_be_listed_is_never_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root every directory can be listed, so the refusal is simulated: the listing of
    the named file's directory fails (a mode 0711 directory to another user, a race)."""
    job = project(tmp_path / "p")
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "lib.rs").write_text("pub fn f() {}\n")
    dep_info(tmp_path / "p", job, "/workspace/src/main.rs", "/deps/lib.rs")
    keeper = stamps(tmp_path / "p", {"/deps": str(deps)})
    built(tmp_path / "p", job, keeper)
    assert keeper.check(job).fresh
    real = os.scandir

    def refusing(path: str) -> object:
        if path == str(deps):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr("fdl_tasks.watch.scan.os.scandir", refusing)
    assert not keeper.check(job).fresh
