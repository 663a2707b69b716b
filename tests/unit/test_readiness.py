"""What prebuild needs, checked first (issue 31, deliver 1): the host's own directories in
the probe's one script, and the controller's problems said as their fix (pure logic)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fdl_tasks.build.readiness import (
    controller_arch_missing,
    crate_missing,
    cross_std_missing,
    has_std,
    root_missing,
    variants_missing,
)
from fdl_tasks.config.model import Worker
from fdl_tasks.preflight.host_paths import HostPaths
from fdl_tasks.preflight.probe import ControllerAbi, ProbeRequest, judge, parse_facts

CONTROLLER = ControllerAbi("x86_64", (2, 36))


def worker(path: str, **fields: object) -> Worker:
    return Worker(**{"host": "h", "path": path, "arch": "precompiled/cu128", **fields})  # type: ignore[arg-type]


def probed(request: ProbeRequest) -> tuple[frozenset[str], list[str]]:
    """The script run here, as a host runs it: what it found missing, and the errors."""
    done = subprocess.run(["sh", "-c", request.script()], capture_output=True, text=True)
    facts = parse_facts(done.stdout)
    assert facts is not None
    return facts.missing, list(judge("h", request, facts, CONTROLLER).errors)


def test_paths_asked_of_a_shared_host_and_a_copy_host() -> None:
    shared = HostPaths.for_worker(worker("/p"), "ddp-bench", "c.yaml")
    assert shared == HostPaths(
        "/p", "/p/libtorch/precompiled/cu128/lib", "/p/ddp-bench", False, "c.yaml"
    )
    # Before the command is known, and for a crate at the root: no working dir to ask.
    assert HostPaths.for_worker(worker("/p"), None, "c.yaml").workdir == ""
    assert HostPaths.for_worker(worker("/p"), "", "c.yaml").workdir == ""
    # A copy host: the copy step makes the working dir; its variant is its own.
    copy = HostPaths.for_worker(worker("/p", delivery="copy"), "ddp-bench", "c.yaml")
    assert copy.copy and copy.workdir == "" and copy.libtorch
    # arch: auto is chosen from the probe's answers: not askable in the same round trip.
    assert HostPaths.for_worker(worker("/p", arch="auto"), None, "c.yaml").libtorch == ""


def test_each_missing_directory_is_found_and_only_the_first_is_said(tmp_path: Path) -> None:
    root = tmp_path / "project; touch pwned"
    lib = root / "libtorch/precompiled/cu128/lib"
    w = worker(str(root))
    request = ProbeRequest.for_host(w, True, "crate", "c.yaml")
    missing, errors = probed(request)
    assert missing == {"path", "libtorch", "workdir"}
    assert errors == [
        f"path {root} does not exist on this host: fix this worker's 'path' in c.yaml "
        "(the project root as this host sees it)"
    ]
    root.mkdir()
    missing, errors = probed(request)
    assert missing == {"libtorch", "workdir"} and errors[0].startswith(
        f"libtorch variant not found at {lib} in this host's view of the project"
    )
    lib.mkdir(parents=True)
    missing, errors = probed(request)
    assert missing == {"workdir"}
    assert errors == [
        f"the command's working directory {root}/crate does not exist on this host: is this "
        "worker's 'path' in c.yaml the project root as this host sees it?"
    ]
    (root / "crate").mkdir()
    assert probed(request) == (frozenset(), [])
    assert not (Path.cwd() / "pwned").exists()


def test_a_copy_host_without_its_variant_is_told_to_push_it() -> None:
    paths = HostPaths.for_worker(worker("/p", delivery="copy"), None, "c.yaml")
    assert paths.errors("node", frozenset({"libtorch"})) == [
        "libtorch variant not found at /p/libtorch/precompiled/cu128/lib: a copy host needs "
        "its own (inv push-libtorch --host node puts it there)"
    ]


def test_the_controller_probe_asks_no_host_directory() -> None:
    """The controller block has no HostPaths: its checks are the controller's own."""
    from fdl_tasks.config.model import Controller

    request = ProbeRequest.for_host(Controller(path="/p"), True, "crate", "c.yaml")
    assert request.paths is None and "path=" not in request.script()


def test_controller_messages_name_the_key_to_fix() -> None:
    assert root_missing("/srv/proj", "fdl.cluster.yml") == (
        "controller.path /srv/proj in fdl.cluster.yml does not exist on this machine: set it "
        "to the project root as this machine sees it (the directory holding Cargo.toml and "
        "libtorch/)"
    )
    assert "is controller.path in c.yaml the project root?" in crate_missing("/p", None, "c.yaml")
    assert "--crate-dir / fdl.crate_dir 'sub'" in crate_missing("/p/sub", "sub", "c.yaml")


def test_missing_variants_are_listed_once_each_in_order() -> None:
    assert variants_missing([]) is None
    absent = [("b", "x", "/p/x/lib"), ("a", "y", "/p/y/lib"), ("a", "y", "/p/y/lib")]
    assert variants_missing(absent) == (
        "libtorch variant(s) not found on the controller (a typo in 'arch'?): "
        "a (arch y): /p/y/lib; b (arch x): /p/x/lib"
    )


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["libstd-0f1e.rlib", "libcore-1.rlib"], True),
        (["libstd-0f1e.rmeta", "libcore-1.rlib"], False),
        (["libstd_detect-1.rlib"], False),
        ([], False),
    ],
)
def test_std_is_an_rlib_in_the_target_libdir(names: list[str], expected: bool) -> None:
    assert has_std(names) is expected


def test_cross_std_message_says_the_rustup_line() -> None:
    text = cross_std_missing(
        {"aarch64-unknown-linux-gnu": "no libstd in /x"}, {"aarch64-unknown-linux-gnu": "aarch64"}
    )
    assert "aarch64-unknown-linux-gnu (for aarch64 hosts): no libstd in /x" in text
    assert "rustup target add aarch64-unknown-linux-gnu" in text


def test_a_controller_arch_typo_names_the_fix_and_what_reads_it() -> None:
    close = controller_arch_missing("precompiled/cu12", "/p/lib", "c.yaml", ["precompiled/cu128"])
    assert "in c.yaml names no libtorch variant on this machine: /p/lib is missing" in close
    assert "(did you mean 'precompiled/cu128'?)" in close
    assert "flodl's launcher builds against it" in close
    # Nothing installed comes close: no guess.
    assert "did you mean" not in controller_arch_missing("x", "/p/lib", "c.yaml", [])
