"""flodl's files read and refused as fdl-cli reads and refuses them (issue #42).

The cases are taken from flodl's own tests (``flodl-cli/src/config/tests/cluster_tests.rs``,
``loading_tests.rs``, ``overlay_tests.rs``), re-typed as YAML, plus the mistakes the issue
lists. Each file goes through the real loader: YAML 1.2 booleans, the layers, the schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fdl_tasks.config.flodl_layers import deep_merge
from fdl_tasks.config.loader import find_cluster_file, load_cluster
from fdl_tasks.core.errors import FdlError

SOLO = """\
cluster:
  controller: {host: 127.0.0.1, port: 29500, path: /tmp/solo}
  workers:
    - {host: solo, local_devices: all, nccl_socket_ifname: lo, path: /tmp/solo}
"""
CANONICAL = """\
cluster:
  controller: {host: 192.168.122.1, port: 29500, path: /opt/flodl}
  workers:
    - {host: host-a, local_devices: [0], nccl_socket_ifname: virbr0, path: /opt/flodl,
       arch: precompiled/cu128}
    - {host: host-b, ssh: {target: host-b}, local_devices: [0, 1],
       nccl_socket_ifname: enp1s0, path: /srv/flodl, arch: builds/sm61-sm120}
commands:
  cuda-test: {cluster: true}
  train: {cluster: true, run: cargo run --release --bin my-training-app}
"""


#: Where SOLO's one worker entry ends: edits there change the worker, not the controller.
WORKER_END = "nccl_socket_ifname: lo, path: /tmp/solo}\n"


def edited(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


ACCEPTED = {
    "canonical": CANONICAL,
    "solo": SOLO,
    "solo, explicit devices": edited(SOLO, "local_devices: all", "local_devices: [3]"),
    "one worker may leave nccl_socket_ifname empty": edited(
        SOLO, "nccl_socket_ifname: lo", 'nccl_socket_ifname: ""'
    ),
    "discovery window, no workers": """\
cluster:
  controller:
    host: 127.0.0.1
    path: /tmp/d
    join: {discovery: true, min_rank_start: 2, token: 0123456789abcdef0123456789abcdef,
           tunnel_only: true}
  workers: []
""",
    "join start hybrid": edited(
        SOLO, "path: /tmp/solo}", "path: /tmp/solo, join: {start: hybrid}}"
    ),
    "port defaults to 1337": edited(SOLO, " port: 29500,", ""),
    "non-reserved env": CANONICAL.replace(
        "commands:", '  env: {NCCL_P2P_DISABLE: "1", FLODL_DASHBOARD_BIND: 0.0.0.0}\ncommands:'
    ),
    "empty ranks slip through": edited(
        SOLO, WORKER_END, "nccl_socket_ifname: lo, path: /tmp/solo, ranks: []}\n"
    ),
    "tunnel, docker, gpu_ram_share, data_path": edited(
        SOLO,
        WORKER_END,
        "nccl_socket_ifname: lo, path: /tmp/solo, tunnel: true, docker: cuda,\n       "
        "gpu_ram_share: 0.5, data_path: /data}\n",
    ),
    "flodl's other keys": "description: x\npublish: {bin: b}\njoin: {bin: t}\n" + SOLO,
}

REFUSED = {
    "start: sometime": (
        edited(SOLO, "path: /tmp/solo}", "path: /tmp/solo, join: {start: sometime}}"),
        "cluster.controller.join.start: must be one of auto | manual | hybrid, got 'sometime'",
    ),
    "min_rank_strat typo": (
        edited(SOLO, "path: /tmp/solo}", "path: /tmp/solo, join: {min_rank_strat: 3}}"),
        "cluster.controller.join.min_rank_strat: unknown field",
    ),
    "no controller.host": (
        edited(SOLO, "host: 127.0.0.1, ", ""),
        "cluster.controller.host: missing field",
    ),
    "blank controller.host": (
        edited(SOLO, "host: 127.0.0.1", 'host: " "'),
        "cluster.controller.host must be non-empty",
    ),
    "port: abc": (
        edited(SOLO, "port: 29500", "port: abc"),
        "cluster.controller.port: expected an integer",
    ),
    "port out of u16": (edited(SOLO, "port: 29500", "port: 70000"), "does not fit (0 to 65535)"),
    "local_devices: some": (
        edited(SOLO, "local_devices: all", "local_devices: some"),
        'cluster.workers[0].local_devices: expected "all" or a list',
    ),
    "local_devices over u8": (
        edited(SOLO, "local_devices: all", "local_devices: [0, 300]"),
        "cluster.workers[0].local_devices[1]: 300 does not fit (0 to 255)",
    ),
    "no local_devices": (edited(SOLO, "local_devices: all, ", ""), "local_devices: missing field"),
    "tunnel: yes-please": (
        edited(SOLO, WORKER_END, "nccl_socket_ifname: lo, path: /tmp/solo, tunnel: yes-please}\n"),
        "cluster.workers[0].tunnel: expected true or false, got 'yes-please'",
    ),
    "tunnel: yes is text in YAML 1.2": (
        edited(SOLO, WORKER_END, "nccl_socket_ifname: lo, path: /tmp/solo, tunnel: yes}\n"),
        "expected true or false, got 'yes'",
    ),
    "two workers, no nccl_socket_ifname": (
        edited(CANONICAL, "nccl_socket_ifname: virbr0", 'nccl_socket_ifname: ""'),
        "cluster.workers[0].nccl_socket_ifname must be non-empty when the cluster spans "
        "multiple workers",
    ),
    "nccl_socket_ifname key missing": (
        edited(SOLO, "nccl_socket_ifname: lo, ", ""),
        "cluster.workers[0].nccl_socket_ifname: missing field",
    ),
    "no workers, no discovery": (
        edited(SOLO, SOLO.split("  workers:")[1], " []\n"),
        "cluster.workers must be non-empty",
    ),
    "workers key missing": (SOLO.split("  workers:")[0], "cluster.workers: missing field"),
    "user-written ranks": (
        edited(SOLO, WORKER_END, "nccl_socket_ifname: lo, path: /tmp/solo, ranks: [0]}\n"),
        "cluster.workers[0].ranks: ranks are not user configuration",
    ),
    "reserved cluster env": (
        SOLO + '  env: {CUDA_VISIBLE_DEVICES: "3"}\n',
        "cluster.env['CUDA_VISIBLE_DEVICES'] is reserved",
    ),
    "reserved worker env": (
        edited(
            SOLO,
            WORKER_END,
            "nccl_socket_ifname: lo, path: /tmp/solo, env: {FLODL_INTERNAL_LOCAL_RANK: '0'}}\n",
        ),
        "cluster.workers[0].env['FLODL_INTERNAL_LOCAL_RANK'] is reserved",
    ),
    "empty worker path": (
        edited(CANONICAL, "path: /opt/flodl,", 'path: "",'),
        "cluster.workers[0].path",
    ),
    "negative gpu_ram_share": (SOLO + "  gpu_ram_share: -0.5\n", "non-negative fraction"),
    "unknown top-level key": ("descripton: x\n" + SOLO, "descripton: unknown field"),
    "our key inside the controller": (
        edited(SOLO, "path: /tmp/solo}", "path: /tmp/solo, cross: {aarch64: {}}}"),
        "cluster.controller.cross is fdl-tasks' key, not flodl's: move cross to fdl-tasks.yml "
        "under controller",
    ),
    "our key inside a worker": (
        edited(SOLO, WORKER_END, "nccl_socket_ifname: lo, path: /tmp/solo, cpu_arch: aarch64}\n"),
        "cluster.workers[0].cpu_arch is fdl-tasks' key, not flodl's: move it to fdl-tasks.yml "
        "under workers",
    ),
    "a docker run mapping": (
        edited(SOLO, "path: /tmp/solo}", "path: /tmp/solo, docker: {image: x}}"),
        "cluster.controller.docker is fdl-tasks' key, not flodl's",
    ),
}


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_flodl_accepts_so_this_tool_does(tmp_path: Path, name: str) -> None:
    cluster = load_cluster(write(tmp_path, "fdl.cluster.yml", ACCEPTED[name]))
    assert cluster.origin is not None and cluster.origin.env == "cluster"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_flodl_refuses_so_this_tool_does_in_one_line(tmp_path: Path, name: str) -> None:
    text, expected = REFUSED[name]
    path = write(tmp_path, "fdl.cluster.yml", text)
    with pytest.raises(FdlError) as refused:
        load_cluster(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: flodl's loader refuses it: "), message
    assert expected in message
    assert "\n" not in message


def test_a_refusal_names_the_layer_that_holds_the_key(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", "cluster:\n  controller: {port: abc}\n")
    overlay = write(tmp_path, "fdl.cluster.yml", SOLO.replace("port: 29500, ", ""))
    with pytest.raises(FdlError) as refused:
        load_cluster(overlay)
    assert str(refused.value).startswith(f"{tmp_path}/fdl.yml: flodl's loader refuses it: ")
    assert "cluster.controller.port: expected an integer" in str(refused.value)


# --------------------------------------------------------------------------- layers

MERGES = [  # overlay_tests.rs: (base, overlay, merged)
    ("42", "99", 99),
    (
        "{a: 1, nested: {x: one, y: two}}",
        "{nested: {y: TWO, z: three}, b: 2}",
        {"a": 1, "b": 2, "nested": {"x": "one", "y": "TWO", "z": "three"}},
    ),
    ("{items: [a, b, c]}", "{items: [x, y]}", {"items": ["x", "y"]}),
    (
        "{ddp: {policy: cadence, anchor: 3}, training: {epochs: 10}}",
        "{ddp: ~, training: {epochs: 20}}",
        {"training": {"epochs": 20}},
    ),
    ("{ddp: {policy: cadence, anchor: 3}}", "{ddp: {anchor: ~}}", {"ddp": {"policy": "cadence"}}),
    ("{a: 1}", "{b: 2}", {"a": 1, "b": 2}),
    ("{ddp: {policy: cadence}}", "{ddp: solo-0}", {"ddp": "solo-0"}),
    (
        "{ddp: solo-0}",
        "{ddp: {policy: cadence, anchor: 3}}",
        {"ddp": {"policy": "cadence", "anchor": 3}},
    ),
]


@pytest.mark.parametrize(("base", "overlay", "expected"), MERGES)
def test_the_merge_is_flodl_s(base: str, overlay: str, expected: Any) -> None:
    assert deep_merge(yaml.safe_load(base), yaml.safe_load(overlay)) == expected


def test_three_layers_fold_left_to_right() -> None:
    first = deep_merge({"a": 1, "b": 1}, {"b": 2, "c": 2})
    assert deep_merge(first, {"c": 3}) == {"a": 1, "b": 2, "c": 3}


def solo_block(host: str = "127.0.0.1") -> str:
    return SOLO.replace("127.0.0.1", host)


def test_the_cluster_block_split_between_fdl_yml_and_the_overlay_is_merged(tmp_path: Path) -> None:
    write(
        tmp_path,
        "fdl.yml",
        "cluster:\n  controller: {host: 10.0.0.1, path: /srv/p}\n"
        "  env: {OMP_NUM_THREADS: '4'}\ncommands: {ddp-bench: {run: cargo run}}\n",
    )
    overlay = write(
        tmp_path,
        "fdl.cluster.yml",
        "cluster:\n  controller: {port: 9000}\n  workers:\n"
        "    - {host: w, local_devices: [0], nccl_socket_ifname: lo, path: /srv/p}\n"
        "commands: {ddp-bench: {cluster: true}}\n",
    )
    cluster = load_cluster(overlay)
    assert cluster.controller.host == "10.0.0.1" and cluster.controller.port == 9000
    assert cluster.env == {"OMP_NUM_THREADS": "4"}
    assert [w.host for w in cluster.workers] == ["w"]
    assert cluster.origin is not None and cluster.origin.root == str(tmp_path)
    assert cluster.origin.layers == (str(tmp_path / "fdl.yml"), str(overlay))


def test_inherit_from_chains_apply_parents_first(tmp_path: Path) -> None:
    """loading_tests.rs' value chain: ci inherits cloud; base, cloud, ci in that order."""
    write(tmp_path, "fdl.yml", "cluster: {env: {VALUE: base, KEEP_BASE: 'yes'}}\n")
    write(tmp_path, "fdl.cloud.yml", solo_block() + "  env: {VALUE: cloud, KEEP_CLOUD: 'yes'}\n")
    ci = write(
        tmp_path,
        "fdl.ci.yml",
        "inherit-from: fdl.cloud.yml\ncluster: {env: {VALUE: ci, KEEP_CI: 'yes'}}\n",
    )
    cluster = load_cluster(ci)
    assert cluster.env == {"VALUE": "ci", "KEEP_BASE": "yes", "KEEP_CLOUD": "yes", "KEEP_CI": "yes"}
    assert cluster.origin is not None
    assert [Path(p).name for p in cluster.origin.layers] == [
        "fdl.yml",
        "fdl.cloud.yml",
        "fdl.ci.yml",
    ]


def test_an_overlay_inheriting_the_base_reads_it_once(tmp_path: Path) -> None:
    write(tmp_path, "fdl.yml", solo_block())
    ci = write(tmp_path, "fdl.ci.yml", "inherit-from: fdl.yml\ncluster: {env: {X: '1'}}\n")
    cluster = load_cluster(ci)
    assert cluster.origin is not None
    assert [Path(p).name for p in cluster.origin.layers] == ["fdl.yml", "fdl.ci.yml"]


def test_inherit_from_home_and_a_base_with_a_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write(home, "shared.yml", solo_block("10.9.9.9"))
    project = tmp_path / "p"
    project.mkdir()
    base = write(project, "fdl.yml", "inherit-from: ~/shared.yml\ndescription: mine\n")
    assert load_cluster(base).controller.host == "10.9.9.9"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"https://example.org/fdl.yml"', "remote parents are not supported"),
        ('""', "must be a non-empty path"),
        ("[a]", "must be a path, got list"),
        ("missing.yml", "not found"),
        ("fdl.ci.yml", "inherit-from cycle detected"),
    ],
)
def test_inherit_from_refusals(tmp_path: Path, value: str, expected: str) -> None:
    ci = write(tmp_path, "fdl.ci.yml", f"inherit-from: {value}\n" + solo_block())
    with pytest.raises(FdlError, match=expected):
        load_cluster(ci)


def test_env_choice_and_its_errors(tmp_path: Path) -> None:
    base = write(tmp_path, "fdl.yml", "description: base\n")
    write(tmp_path, "fdl.cluster.yml", solo_block("10.0.0.1"))
    vm = write(tmp_path, "fdl.vm.yml", solo_block("10.0.0.2"))
    assert load_cluster(base).controller.host == "10.0.0.1"  # env cluster by default
    assert load_cluster(base, "vm").controller.host == "10.0.0.2"
    with pytest.raises(FdlError, match="environment 'nope' not found"):
        load_cluster(base, "nope")
    with pytest.raises(FdlError, match="conflicting envs"):
        load_cluster(vm, "cluster")
    with pytest.raises(FdlError, match="not a name flodl can load"):
        load_cluster(base, "../x")


def test_yaml_overlay_wins_over_yml(tmp_path: Path) -> None:
    base = write(tmp_path, "fdl.yml", "description: base\n")
    write(tmp_path, "fdl.ci.yml", solo_block("10.0.0.1"))
    write(tmp_path, "fdl.ci.yaml", solo_block("10.0.0.2"))
    assert load_cluster(base, "ci").controller.host == "10.0.0.2"


def test_a_base_alone_with_no_cluster_block_says_where_it_belongs(tmp_path: Path) -> None:
    base = write(tmp_path, "fdl.yml", "commands: {a: {run: x}}\n")
    with pytest.raises(FdlError, match="holds no cluster block"):
        load_cluster(base)


def test_the_cluster_file_is_found_as_fdl_cli_finds_the_project(tmp_path: Path) -> None:
    base = write(tmp_path, "fdl.yml", "description: base\n")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_cluster_file(deep) == base
    own = write(deep, "cluster.yaml", "controller: {path: /p}\n")
    assert find_cluster_file(deep) == own  # this tool's own file first
    with pytest.raises(FdlError, match="no cluster file"):
        find_cluster_file(Path("/proc/self"))


# --------------------------------------------------------------------------- extras


def test_fdl_tasks_yml_adds_our_keys_by_host_label(tmp_path: Path) -> None:
    overlay = write(tmp_path, "fdl.cluster.yml", CANONICAL)
    write(
        tmp_path,
        "fdl-tasks.yml",
        "controller:\n  docker: {image: 'img:{cuda_tag}'}\n  cross: {aarch64: {}}\n"
        "workers:\n  host-b: {cpu_arch: aarch64, delivery: copy}\n",
    )
    cluster = load_cluster(overlay)
    assert cluster.worker("host-b").cpu_arch == "aarch64"
    assert cluster.worker("host-b").delivery == "copy"
    assert cluster.worker("host-a").delivery == "shared"
    assert "aarch64" in cluster.controller.cross


@pytest.mark.parametrize(
    ("extras", "expected"),
    [
        ("workers: {host-c: {cpu_arch: x86_64}}", "no worker of"),
        ("workers: {host-aa: {cpu_arch: x86_64}}", "did you mean 'host-a'"),
        ("workers: {host-a: {local_devices: all}}", "local_devices is flodl's key: set it in"),
        ("controller: {host: x}", "controller.host is flodl's key"),
        ("controller: {docker: cuda}", "the compose service is flodl's controller.docker"),
        ("gpus: 2", "unknown key 'gpus'"),
        ("[]", "expected a mapping"),
    ],
)
def test_fdl_tasks_yml_refusals(tmp_path: Path, extras: str, expected: str) -> None:
    overlay = write(tmp_path, "fdl.cluster.yml", CANONICAL)
    write(tmp_path, "fdl-tasks.yml", extras + "\n")
    with pytest.raises(FdlError, match=expected):
        load_cluster(overlay)
