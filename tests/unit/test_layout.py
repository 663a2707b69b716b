"""The target-dir layout (pure): keys, shared dirs, stale entries for ``clean``."""

from __future__ import annotations

from typing import Any

import attrs

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import live_target_dirs, plan_builds
from fdl_tasks.config.layout import (
    BuildKey,
    envelope_file,
    host_binary,
    log_file,
    shared_dir,
    stale_dirs,
)
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import Cluster

KEY = BuildKey(mode="docker", arch="precompiled/cu128", features=("cuda",), environment="img:12.8")


def cluster(archs: dict[str, str], **controller: Any) -> Cluster:
    workers = [{"host": h, "path": "/mnt/p", "arch": a} for h, a in archs.items()]
    data: dict[str, Any] = {"controller": {"path": "/srv/p", **controller}, "workers": workers}
    return parse_cluster(data, "c.yaml")


def test_shared_dir_is_keyed_by_environment_not_command() -> None:
    c = cluster({"a": "precompiled/cu128", "b": "precompiled/cu128", "c": "precompiled/cpu"})
    train = plan_builds(c.workers, backend_for(c), "train", "", True)
    evaluate = plan_builds(c.workers, backend_for(c), "eval", "crates/eval", True)
    assert [j.target_dir for j in train] == [j.target_dir for j in evaluate]
    assert len({j.target_dir for j in train}) == 2
    assert [j.log_file for j in train] != [j.log_file for j in evaluate]  # one log per command


def test_every_field_of_the_key_changes_the_dir() -> None:
    changes: dict[str, Any] = {
        "mode": "compose",
        "arch": "precompiled/cu126",
        "features": (),
        "environment": "img:12.6",
        "cpu_arch": "aarch64",
        "rust_target": "aarch64-unknown-linux-gnu",
        "linker": "cc",
    }
    dirs = {shared_dir(attrs.evolve(KEY, **{field: value})) for field, value in changes.items()}
    assert len(dirs | {shared_dir(KEY)}) == len(changes) + 1


def test_the_key_names_its_fields() -> None:
    """The digest is of named fields: a field added later cannot shift another's meaning."""
    assert KEY.marker() == (
        '{"arch":"precompiled/cu128","cpu_arch":null,"environment":"img:12.8",'
        '"features":["cuda"],"linker":null,"mode":"docker","rust_target":null}'
    )
    assert shared_dir(KEY) == f"target/cluster/_shared/precompiled-cu128-{KEY.digest}"


def test_paths_of_one_command() -> None:
    assert host_binary("n1", "builds/sm61", "train", "aarch64") == (
        "target/cluster/n1/builds-sm61-aarch64/release/train"
    )
    assert (
        log_file("target/cluster/_shared/x", "train") == "target/cluster/_shared/x/build-train.log"
    )
    assert envelope_file("train") == "target/cluster/_envelopes/train.json"


def test_live_dirs_cover_both_modes_and_every_possible_cpu() -> None:
    c = cluster(
        {"a": "precompiled/cu128"}, docker={"image": "img:{cuda_tag}"}, cross={"aarch64": {}}
    )
    live = live_target_dirs(c.workers, backend_for(c))
    assert "target/cluster/a/precompiled-cu128" in live
    assert "target/cluster/a/precompiled-cu128-aarch64" in live
    shared = plan_builds(c.workers, backend_for(c), "x", "", True)[0].target_dir
    assert shared in live and len(live) == 4


def test_stale_entries() -> None:
    live = {"target/cluster/a/precompiled-cu128", "target/cluster/_shared/precompiled-cu128-1"}
    existing = [
        "_envelopes",
        "_prebuild.lock",
        "_watch",
        "_envelope.json",  # the old layout's single envelope
        "_shared",
        "_shared/precompiled-cu128-1",
        "_shared/precompiled-cu126-2",  # arch swapped
        "a",
        "a/precompiled-cu128",
        "a/precompiled-cu126",
        "gone",  # a host that left
        "gone/precompiled-cpu",
    ]
    assert stale_dirs(existing, live) == [
        "_envelope.json",
        "_shared/precompiled-cu126-2",
        "a/precompiled-cu126",
        "gone",
    ]
    assert stale_dirs(["_shared", "_shared/x"], set()) == ["_shared"]
