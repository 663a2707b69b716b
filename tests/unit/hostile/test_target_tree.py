"""Host labels and arches: every accepted one stays inside ``target/cluster/`` and ``libtorch/``.

The oracle is where the paths end up once normalised, not a pattern of
acceptable labels: a label is one directory under ``target/cluster/`` that no
other host and no shared build shares, an arch is one slug there and a
directory strictly under ``libtorch/``.
"""

from __future__ import annotations

import os

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.layout import host_binary as binary_path
from fdl_tasks.config.layout import host_dir as target_dir
from fdl_tasks.config.variants import libtorch_dir
from tests.unit.hostile.conftest import arches, commands, labels, load, one_worker


@settings(max_examples=400, deadline=None)
@given(hosts=st.lists(st.tuples(labels, arches), min_size=1, max_size=3), command=commands)
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
        },
        "workers[",
    )
    if cluster is None:
        return
    for worker in cluster.workers:
        assert worker.arch is not None
        target = os.path.normpath(target_dir(worker.host, worker.arch)).split("/")
        assert len(target) == 4, target
        assert target[:3] == ["target", "cluster", worker.host]
        assert target[3] not in ("", ".", "..")
        assert not target[2].startswith("_"), "host dirs must never collide with _shared"
        binary = os.path.normpath(binary_path(worker.host, worker.arch, command)).split("/")
        assert binary == [*target, "release", command]
        library = os.path.normpath(libtorch_dir("/p", worker.arch)).split("/")
        assert library[:3] == ["", "p", "libtorch"] and len(library) > 3, library
    host_dirs = [os.path.normpath(target_dir(w.host, w.arch or "")) for w in cluster.workers]
    assert len(set(host_dirs)) == len(host_dirs), "two hosts share a target dir"
    for job in plan_builds(cluster.workers, backend_for(cluster), command, "", shared=True):
        shared = os.path.normpath(job.target_dir).split("/")
        assert len(shared) == 4 and shared[:3] == ["target", "cluster", "_shared"], shared
        assert shared[3] not in ("", ".", "..")
        assert os.path.normpath(job.built_binary).split("/") == [*shared, "release", command]
        for host in job.hosts:
            mine = os.path.normpath(job.host_binary(host)).split("/")
            assert mine[:3] == ["target", "cluster", host] and len(mine) == 6, mine
    for job in plan_builds(cluster.workers, backend_for(cluster), command, "", shared=False):
        (host,) = job.hosts
        own = os.path.normpath(job.target_dir).split("/")
        assert own[:3] == ["target", "cluster", host] and len(own) == 4, own
