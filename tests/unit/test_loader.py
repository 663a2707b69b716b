"""cluster.yaml model: accepted forms and every kind of rejection."""

from __future__ import annotations

from pathlib import Path

import pytest

from fdl_tasks.config.loader import load_cluster, parse_cluster
from fdl_tasks.config.model import DEFAULT_DATA_PATH, DockerSettings
from fdl_tasks.core.errors import FdlError
from tests.conftest import DATA

FULL = """
controller:
  path: /srv/proj
  arch: precompiled/cu128
  host: ctrl          # flodl's own keys are carried
  port: 9000
  docker:
    image: "flodl-cuda:{cuda_tag}"
    cuda_version: "12.8"
    run_args: ["--gpus", "all"]
    env: {RUSTFLAGS: "-C target-cpu=native"}
workers:
  - host: node-b
    path: /mnt/proj/
    arch: builds/sm61-sm120
    data_path: /data
    ssh:
      target: 10.0.0.2
      port: 2222
      user: me
      identity_file: ~/.ssh/id_ed25519
      options: [ProxyJump=bastion, "ConnectTimeout 3"]
    env: {NCCL_P2P_DISABLE: 1}
    local_devices: [0, 1]
    nccl_socket_ifname: eth0
    tunnel: {kind: wireguard}
    docker: flodl-cuda
env: {NCCL_DEBUG: INFO}
"""


def test_full_file_is_structured(write_cluster):  # type: ignore[no-untyped-def]
    cluster = load_cluster(write_cluster(FULL))
    assert isinstance(cluster.controller.docker, DockerSettings)
    assert cluster.controller.docker.run_args == ("--gpus", "all")
    assert cluster.controller.docker.workspace == "/workspace"
    assert cluster.controller.host == "ctrl"
    worker = cluster.workers[0]
    assert worker.ssh.port == 2222 and worker.ssh_target == "10.0.0.2"
    assert worker.ssh.options == ("ProxyJump=bastion", "ConnectTimeout 3")
    assert worker.env == {"NCCL_P2P_DISABLE": "1"}  # YAML int kept as text
    assert worker.local_devices == [0, 1] and worker.tunnel == {"kind": "wireguard"}
    assert cluster.env == {"NCCL_DEBUG": "INFO"}


def test_under_a_cluster_key_it_is_flodl_s_form_and_flodl_s_rules_hold(write_cluster):  # type: ignore[no-untyped-def]
    """A top-level ``cluster:`` makes it a flodl file: this tool's own form (a ``docker
    run`` mapping, a map for ``tunnel``) is what fdl-cli refuses, so it is refused here."""
    nested = "cluster:\n" + "".join(f"  {line}\n" for line in FULL.splitlines())
    with pytest.raises(FdlError) as refused:
        load_cluster(write_cluster(nested))
    assert "flodl's loader refuses it: cluster.controller.docker is fdl-tasks' key" in str(
        refused.value
    )


def test_minimal_defaults() -> None:
    cluster = parse_cluster({"controller": {"path": "/p"}}, "x.yaml")
    assert cluster.workers == () and cluster.controller.docker is None
    worker = parse_cluster(
        {"controller": {"path": "/p"}, "workers": [{"host": "a", "path": "/q"}]}, "x"
    ).workers[0]
    assert worker.ssh_target == "a" and worker.data_path is None
    assert DEFAULT_DATA_PATH == "/flodl/data"


# Each bad file, with the key path and the expectation its message must name.
BAD_FILES = {
    "syntax.yaml": ["not valid YAML", "line 6"],
    "unknown_key.yaml": ["workers[0]", "unknown key(s) gpus"],
    "port_type.yaml": ["workers[2].ssh.port", "expected an integer", "twenty-two"],
    "missing_path.yaml": ["workers[0].path", "required key missing"],
    "empty_path.yaml": ["controller.path", "non-empty absolute path"],
    "duplicate_host.yaml": ["workers[1].host", "already used by workers[0]"],
    "label_slash.yaml": ["workers[0].host", "'../escape'", "directory name"],
    "arch_dotdot.yaml": ["workers[0].arch", "no '..'"],
    "arch_absolute.yaml": ["workers[0].arch", "'/opt/libtorch'"],
    "control_char.yaml": ["workers[0].host", "control character"],
    "not_mapping.yaml": ["expected a mapping", "a list"],
    "missing_controller.yaml": ["controller", "required key missing"],
    "options_not_list.yaml": ["workers[0].ssh.options", "expected a list"],
    "env_value_list.yaml": ["env['NCCL_DEBUG']", "expected a string or a number"],
    "relative_path.yaml": ["workers[0].path", "expected an absolute path"],
    "docker_unknown.yaml": ["controller.docker", "unknown key(s) mounts"],
    "billion_laughs.yaml": ["expands to more than 100000 values"],
    "duplicate_key.yaml": ["line 4", "key 'controller' is given twice", "lines 1 and 4"],
    "reserved_env.yaml": ["workers[0].env['CUDA_VISIBLE_DEVICES']", "is reserved"],
    "ram_share.yaml": ["workers[0].gpu_ram_share", "non-negative fraction", "-0.5"],
    "long_value.yaml": ["workers[0].host", "'a/a/a/a/", "…"],
}


def test_every_bad_file_is_listed() -> None:
    assert sorted(p.name for p in (DATA / "bad").iterdir()) == sorted(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_gives_one_clear_paragraph(name: str) -> None:
    path = DATA / "bad" / name
    with pytest.raises(FdlError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert str(path) in message
    assert "\n" not in message
    for fragment in BAD_FILES[name]:
        assert fragment in message


def test_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FdlError, match="not found"):
        load_cluster(tmp_path / "nope.yaml")


def test_several_problems_reported_together() -> None:
    data = {"controller": {"path": "rel"}, "workers": [{"host": "a/b", "path": "/x", "arch": ""}]}
    with pytest.raises(FdlError) as caught:
        parse_cluster(data, "c.yaml")
    for key in ("controller.path", "workers[0].host", "workers[0].arch"):
        assert key in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("port", 0, "1 to 65535"),
        ("port", True, "a boolean"),
        ("options", ["=x"], "Key=Value"),
        ("user", 5, "expected a string"),
    ],
)
def test_ssh_values(field: str, value: object, fragment: str) -> None:
    data = {
        "controller": {"path": "/p"},
        "workers": [{"host": "a", "path": "/x", "ssh": {field: value}}],
    }
    with pytest.raises(FdlError, match=rf"workers\[0\]\.ssh\.{field}.*{fragment}"):
        parse_cluster(data, "c.yaml")
