"""A binary is current only if it was built from the bytes on disk now, for real.

Each case edits a file so that cargo's mtime rule calls the last build fresh
(the same second, an mtime set back, a path dependency, an ``include_str!``
file, a build script's ``rerun-if-changed`` input), runs the real ``inv
prebuild``, then runs the host's published binary over its own sshd and reads
what it prints: never a log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdl_tasks.build.build_record import VERSION
from fdl_tasks.publish.envelope import decode
from rig.harness import RigCluster, Running, start_rig
from rig.project import FIXTURE_DIR
from rig.sshrig import HostSpec
from tests.rig.test_everyday import containers_run, docker_calls

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [HostSpec("f1", "127.0.0.150")]
ARCH = "precompiled/cu128"
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
MODES = ("native", "docker")
MAIN_RS = "ddp-bench/src/main.rs"
BUILD_RS = "ddp-bench/build.rs"
UTIL_RS = "fixture-util/src/lib.rs"
#: main.rs printing ``note=<NOTE>`` at the end of its first line, NOTE given as Rust text.
PRINT = 'cuda={cuda}");'
HOUR = 3600 * 1_000_000_000


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    with start_rig(tmp_path_factory.mktemp("fresh"), HOSTS, [ARCH], docker=True) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def pristine(rig: RigCluster) -> Iterator[None]:
    """The fixture's own sources and no target tree at each test's start."""
    for name in (MAIN_RS, BUILD_RS, UTIL_RS):
        shutil.copyfile(FIXTURE_DIR / name, rig.project / name)
    for name in ("ddp-bench/src/note.txt", "ddp-bench/note.txt"):
        (rig.project / name).unlink(missing_ok=True)
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    yield
    Running.stop_all()


def cluster_file(rig: RigCluster, mode: str) -> Path:
    docker = {"docker": rig.docker_settings()} if mode == "docker" else {}
    return rig.write([rig.worker("f1", arch=ARCH)], f"{mode}.yaml", **docker)


def prebuild(
    rig: RigCluster, path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env={**ENV, **(env or {})}
    )
    assert done.returncode == 0, done.stderr
    return done


def printed(rig: RigCluster) -> str:
    """The first line the host's published binary prints, run over its own sshd."""
    envelope = rig.project / "target/cluster/_envelopes/ddp-bench.json"
    entry = decode(envelope.read_text(), str(envelope))["f1"]
    return rig.run_on_host("f1", str(rig.project), entry)


def main_printing(rig: RigCluster, note: str) -> None:
    """main.rs with ``note={}`` of the Rust expression ``note`` after its first line."""
    main = rig.project / MAIN_RS
    text = (FIXTURE_DIR / MAIN_RS).read_text()
    main.write_text(text.replace(PRINT, f'cuda={{cuda}} note={{}}", {note});'))


def rewrite(path: Path, text: str, mtime_ns: int) -> None:
    """``path`` holding ``text``, its mtime then set to ``mtime_ns`` (a mount keeping
    seconds, ``rsync -t``, ``cp -p``)."""
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def built_then_rewritten(
    rig: RigCluster, mode: str, name: str, first: str, second: str, back_ns: int
) -> tuple[str, str]:
    """``name`` holding ``first``, built and published; then ``second`` with the mtime it
    had plus ``back_ns`` (negative: set back), built again: what the host printed after
    each build."""
    path, cluster = rig.project / name, cluster_file(rig, mode)
    path.write_text(first)
    prebuild(rig, cluster)
    before = printed(rig)
    rewrite(path, second, path.stat().st_mtime_ns + back_ns)
    prebuild(rig, cluster)
    return before, printed(rig)


def notes(lines: tuple[str, str]) -> tuple[str, str]:
    """The ``note=`` each line ends with."""
    return lines[0].rpartition("note=")[2], lines[1].rpartition("note=")[2]


@pytest.mark.parametrize("mode", MODES)
def test_a_second_save_in_the_same_second(rig: RigCluster, mode: str) -> None:
    main_printing(rig, '"a"')
    first = (rig.project / MAIN_RS).read_text()
    second = first.replace('"a"', '"b"')
    assert notes(built_then_rewritten(rig, mode, MAIN_RS, first, second, 1_000)) == ("a", "b")


@pytest.mark.parametrize("mode", MODES)
def test_a_change_whose_mtime_goes_back_an_hour(rig: RigCluster, mode: str) -> None:
    main_printing(rig, '"a"')
    first = (rig.project / MAIN_RS).read_text()
    second = first.replace('"a"', '"bb"')
    assert notes(built_then_rewritten(rig, mode, MAIN_RS, first, second, -HOUR)) == ("a", "bb")


def test_a_path_dependency_changed_with_an_old_mtime(rig: RigCluster) -> None:
    main_printing(rig, "fixture_util::NOTE")
    util = (FIXTURE_DIR / UTIL_RS).read_text()
    first = util + '\npub const NOTE: &str = "a";\n'
    second = util + '\npub const NOTE: &str = "b";\n'
    assert notes(built_then_rewritten(rig, "docker", UTIL_RS, first, second, -HOUR)) == ("a", "b")


def test_an_include_str_file_changed(rig: RigCluster) -> None:
    main_printing(rig, 'include_str!("note.txt").trim()')
    note = "ddp-bench/src/note.txt"
    assert notes(built_then_rewritten(rig, "native", note, "a\n", "b\n", 1_000)) == ("a", "b")


@pytest.mark.parametrize("mode", MODES)
def test_a_build_scripts_declared_input_changed_with_an_old_mtime(
    rig: RigCluster, mode: str
) -> None:
    build_rs = rig.project / BUILD_RS
    build_rs.write_text(
        (FIXTURE_DIR / BUILD_RS)
        .read_text()
        .replace(
            "fn main() {",
            "fn main() {\n"
            '    println!("cargo:rerun-if-changed=note.txt");\n'
            '    let note = std::fs::read_to_string("note.txt").unwrap();\n'
            '    println!("cargo:rustc-env=FDL_NOTE={}", note.trim());',
            1,
        )
    )
    main_printing(rig, 'env!("FDL_NOTE")')
    lines = built_then_rewritten(rig, mode, "ddp-bench/note.txt", "a\n", "b\n", -HOUR)
    assert notes(lines) == ("a", "b")


def test_a_no_op_rebuilds_nothing_and_starts_no_container(rig: RigCluster) -> None:
    cluster = cluster_file(rig, "docker")
    prebuild(rig, cluster)
    shim, calls = docker_calls(rig, "fresh-noop")
    noop = prebuild(rig, cluster, shim)
    assert containers_run(calls) == 0, calls.read_text()
    assert "Compiling" not in noop.stderr
    assert "cargo not started" in noop.stderr


def test_launch_refuses_a_binary_whose_sources_changed(rig: RigCluster) -> None:
    """The sidecar of the envelope names the tree each binary was built from: a source
    changed since (in the same second) is refused in one line naming it and the fix;
    ``--stale-ok`` launches the older binary anyway."""
    cluster = cluster_file(rig, "native")
    main_printing(rig, '"a"')
    prebuild(rig, cluster)
    sidecar = rig.project / "target/cluster/_envelopes/ddp-bench.sources.json"
    assert "f1" in sidecar.read_text()
    launch = ("launch", "--cmd", "ddp-bench", "--cluster-file", str(cluster))
    ok = rig.inv(*launch, env=ENV)
    assert ok.returncode == 0 and "[f1] ddp-bench" in ok.stdout and "note=a" in ok.stdout, ok.stderr

    main = rig.project / MAIN_RS
    rewrite(main, main.read_text().replace('"a"', '"b"'), main.stat().st_mtime_ns + 1_000)
    refused = rig.inv(*launch, env=ENV)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "fdl: f1's binary of ddp-bench was built before ddp-bench/src/main.rs changed: run "
        "inv prebuild --cmd ddp-bench (or launch it anyway with --stale-ok)"
    ], refused.stderr
    assert "[f1]" not in refused.stdout
    stale = rig.inv(*launch, "--stale-ok", env=ENV)
    assert stale.returncode == 0 and "note=a" in stale.stdout, stale.stderr
    prebuild(rig, cluster)
    rebuilt = rig.inv(*launch, env=ENV)
    assert rebuilt.returncode == 0 and "note=b" in rebuilt.stdout, rebuilt.stderr


def record_of(rig: RigCluster) -> Path:
    (record,) = (rig.project / "target/cluster").glob("*/*/.fdl-record-ddp-bench.json")
    return record


def truncate(rig: RigCluster) -> None:
    record = record_of(rig)
    record.write_text(record.read_text()[:100])


def another_version(rig: RigCluster) -> None:
    record = record_of(rig)
    text = record.read_text()
    assert f'"version": {VERSION}' in text
    record.write_text(text.replace(f'"version": {VERSION}', '"version": 999', 1))


HOSTILE = {"truncated": truncate, "another-version": another_version}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_record_that_cannot_be_trusted_rebuilds(rig: RigCluster, hostile: str) -> None:
    """Saved in the same second as the build, then the record damaged: every unit that
    read the project is rebuilt, never the old binary published."""
    cluster = cluster_file(rig, "native")
    main_printing(rig, '"a"')
    prebuild(rig, cluster)
    main = rig.project / MAIN_RS
    rewrite(main, main.read_text().replace('"a"', '"b"'), main.stat().st_mtime_ns + 1_000)
    HOSTILE[hostile](rig)
    done = prebuild(rig, cluster)
    assert printed(rig).endswith("note=b"), done.stderr
    assert "no usable record of what the last build read" in done.stderr


def test_a_source_deleted_and_recreated_with_the_same_stat_is_rebuilt(rig: RigCluster) -> None:
    cluster = cluster_file(rig, "docker")
    main_printing(rig, '"a"')
    prebuild(rig, cluster)
    main = rig.project / MAIN_RS
    before = main.stat()
    text = main.read_text().replace('"a"', '"b"')
    main.unlink()
    main.write_text(text)
    os.utime(main, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert main.stat().st_size == before.st_size and main.stat().st_mtime_ns == before.st_mtime_ns
    prebuild(rig, cluster)
    assert printed(rig).endswith("note=b")


@pytest.mark.parametrize("mode", MODES)
def test_a_symlinked_source_changed_behind_its_link_is_rebuilt(rig: RigCluster, mode: str) -> None:
    """main.rs is a link to a file elsewhere in the project; the file is saved again in
    the same second."""
    main_printing(rig, '"a"')
    main = rig.project / MAIN_RS
    real = rig.project / "ddp-bench/real-main.rs"
    real.write_text(main.read_text())
    main.unlink()
    main.symlink_to("../real-main.rs")
    try:
        cluster = cluster_file(rig, mode)
        prebuild(rig, cluster)
        assert printed(rig).endswith("note=a")
        rewrite(real, real.read_text().replace('"a"', '"b"'), real.stat().st_mtime_ns + 1_000)
        prebuild(rig, cluster)
        assert printed(rig).endswith("note=b")
    finally:
        main.unlink()
        real.unlink()
