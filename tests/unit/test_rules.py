"""Pure naming rules: slugs, features, CUDA versions, controller detection, paths."""

from __future__ import annotations

import pytest

from fdl_tasks.config.layout import arch_slug
from fdl_tasks.config.layout import host_binary as binary_path
from fdl_tasks.config.layout import host_dir as target_dir
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.names import check_command, check_crate_dir, controller_label, remote_workers
from fdl_tasks.config.variants import arch_cuda, cargo_features, require_arch
from fdl_tasks.core.errors import FdlError
from fdl_tasks.publish.envelope import PerHostEnvelope


@pytest.mark.parametrize(
    ("arch", "slug", "features", "cuda"),
    [
        ("precompiled/cu128", "precompiled-cu128", ("cuda",), "12.8"),
        ("precompiled/cu118", "precompiled-cu118", ("cuda",), "11.8"),
        ("precompiled/cu126-pt27", "precompiled-cu126-pt27", ("cuda",), "12.6"),
        ("builds/sm61-sm120", "builds-sm61-sm120", ("cuda",), None),
        ("precompiled/cpu", "precompiled-cpu", (), None),
        ("cpu", "cpu", (), None),
        ("precompiled/cuda", "precompiled-cuda", ("cuda",), None),
    ],
)
def test_arch_rules(arch: str, slug: str, features: tuple[str, ...], cuda: str | None) -> None:
    assert arch_slug(arch) == slug
    assert cargo_features(arch) == features
    found = arch_cuda(arch)
    assert (found.tag if found else None) == cuda
    assert (found.version if found else None) == (f"{cuda}.0" if cuda else None)


def test_target_dir_is_keyed_by_host_and_arch() -> None:
    assert target_dir("node-b", "precompiled/cu128") == ("target/cluster/node-b/precompiled-cu128")
    assert binary_path("node-b", "builds/sm61-sm120", "bench") == (
        "target/cluster/node-b/builds-sm61-sm120/release/bench"
    )
    assert target_dir("a", "x/cu128") != target_dir("a", "x/cu126")


def test_controller_label_precedence() -> None:
    assert controller_label("opt", "env", "host") == "opt"
    assert controller_label("", "env", "host") == "env"
    assert controller_label("", None, "host") == "host"
    assert controller_label("", "", "host") == "host"


def test_controller_is_found_by_label_never_by_address() -> None:
    cluster = parse_cluster(
        {
            "controller": {"path": "/p"},
            "workers": [
                {"host": "ctrl", "path": "/p", "ssh": {"target": "10.0.0.9"}},
                {"host": "vm", "path": "/p", "ssh": {"target": "127.0.0.1", "port": 2201}},
                {"host": "box", "path": "/p", "ssh": {"target": "127.0.0.1", "port": 2202}},
            ],
        },
        "c.yaml",
    )
    assert [w.host for w in remote_workers(cluster, "ctrl")] == ["vm", "box"]
    assert [w.host for w in remote_workers(cluster, "elsewhere")] == ["ctrl", "vm", "box"]


@pytest.mark.parametrize("bad", ["", "a b", "../x", "x;rm", "-flag", "a/b", "é"])
def test_command_names_are_checked(bad: str) -> None:
    with pytest.raises(FdlError, match="not a valid binary name"):
        check_command(bad)


def test_crate_dir() -> None:
    assert check_crate_dir("") == "" and check_crate_dir(".") == ""
    assert check_crate_dir("crates/ddp-bench/") == "crates/ddp-bench"
    for bad in ("/abs", "../up", "a/../b", "a//b"):
        with pytest.raises(FdlError):
            check_crate_dir(bad)


def test_arch_is_required_with_examples() -> None:
    worker = parse_cluster(
        {"controller": {"path": "/p"}, "workers": [{"host": "a", "path": "/q"}]}, "c"
    ).workers[0]
    with pytest.raises(FdlError, match=r"'a' has no 'arch'.*precompiled/cu128"):
        require_arch(worker)


def test_envelope_paths_are_in_the_workers_view() -> None:
    worker = parse_cluster(
        {
            "controller": {"path": "/srv/proj"},
            "workers": [{"host": "b", "path": "/mnt/proj/", "arch": "builds/sm61-sm120"}],
        },
        "c",
    ).workers[0]
    entry = PerHostEnvelope.for_worker(worker, "bench", "ddp-bench")
    assert entry == PerHostEnvelope(
        bin="target/cluster/b/builds-sm61-sm120/release/bench",
        ld_library_path="/mnt/proj/libtorch/builds/sm61-sm120/lib",
        cwd_subpath="ddp-bench",
    )
