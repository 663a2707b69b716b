"""Warm build containers' pure side: what makes one, what it stands for, what is never warm."""

from __future__ import annotations

import shlex

import pytest

from fdl_tasks.build.warm_containers import (
    WARM_IMAGE_LABEL,
    WarmSettings,
    bind_sources,
    client_variables,
    cold_reason,
    exec_line,
    gone_reason,
    identity,
    keeper,
    keeper_argv,
    run_start,
    spec_digest,
    warm_name,
)

OPTIONS = [
    "-v",
    "/p:/workspace",
    "-v",
    "/p/libtorch/precompiled/cpu:/opt/libtorch:ro",
    "--volume=/root/.rustup:/opt/rustup:ro",
    "--mount",
    "type=bind,source=/srv/x,target=/x",
    "-v",
    "named:/cache",
    "--env-file",
    "/etc/build.env",
    "-e",
    "CARGO_TARGET_DIR=/t",
    "-e",
    "SECRET",
    "--env=TOKEN",
    "img:1",
]


def test_bind_sources_are_the_absolute_host_paths() -> None:
    assert bind_sources(OPTIONS) == ["/p", "/p/libtorch/precompiled/cpu", "/root/.rustup", "/srv/x"]
    assert bind_sources(OPTIONS, env_files=True) == ["/etc/build.env"]


def test_client_variables_are_those_given_without_a_value() -> None:
    assert client_variables(OPTIONS) == ["SECRET", "TOKEN"]


@pytest.mark.parametrize(
    "option", ["--entrypoint=/bin/x", "--entrypoint", "-t", "-it", "--interactive", "--tty"]
)
def test_an_entrypoint_or_a_terminal_is_never_warm(option: str) -> None:
    assert cold_reason([*OPTIONS[:-1], option, "img:1"]) is not None


def test_plain_options_are_warm() -> None:
    assert cold_reason(OPTIONS) is None
    assert cold_reason(["-eRUST_LOG=info", "--label=a=b", "img"]) is None


def test_every_input_changes_the_digest_and_so_the_name() -> None:
    base = spec_digest("/p", "sha256:a", OPTIONS, ["/p 1:2"])
    changed = [
        spec_digest("/q", "sha256:a", OPTIONS, ["/p 1:2"]),  # another project
        spec_digest("/p", "sha256:b", OPTIONS, ["/p 1:2"]),  # the image's content
        spec_digest("/p", "sha256:a", [*OPTIONS[:-1], "-e", "A=1", "img:1"], ["/p 1:2"]),
        spec_digest("/p", "sha256:a", OPTIONS, ["/p 1:3"]),  # a directory replaced
        spec_digest("/p", "sha256:a", OPTIONS, ["/p 1:2", "mounted /p/target"]),
    ]
    assert len({base, *changed}) == 6
    assert len({warm_name(d) for d in (base, *changed)}) == 6
    assert spec_digest("/p", "sha256:a", OPTIONS, ["/p 1:2"]) == base


def test_the_container_is_made_with_the_build_s_options_and_runs_the_keeper() -> None:
    ids = identity("fdl-warm-x", "/p", "job", "sha256:a")
    argv = shlex.split(run_start(OPTIONS)(ids, keeper_argv(WarmSettings(60))))
    assert argv[:6] == ["docker", "run", "-d", "--rm", "--name", "fdl-warm-x"]
    assert f"--label={WARM_IMAGE_LABEL}=sha256:a" in argv
    image = argv.index("img:1")
    assert argv[image - len(OPTIONS) + 1 : image + 1] == OPTIONS  # unchanged, in order
    assert argv[image + 1 : image + 3] == ["sh", "-c"]
    assert "-lt 60 ]" in argv[-1]


def test_a_build_is_an_exec_of_the_same_command() -> None:
    line = exec_line("fdl-warm-x", ["sh", "-c", "cargo build --bin 'a b'"])
    argv = shlex.split(line)
    assert argv[:4] == ["docker", "exec", "fdl-warm-x", "sh"]
    assert argv[-4:] == ["sh", "sh", "-c", "cargo build --bin 'a b'"]


def test_the_keeper_counts_whole_seconds() -> None:
    assert "-lt 1800 ]" in keeper(1800)


def test_gone_before_its_idle_timeout_is_said() -> None:
    settings = WarmSettings(100)
    assert gone_reason(None, 1000.0, settings) is None  # never made
    assert gone_reason(850.0, 1000.0, settings) is None  # it stopped itself
    assert gone_reason(950.0, 1000.0, settings) is not None
