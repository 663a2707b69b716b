"""The build command lines (native cargo, ``docker run``, ``docker compose run``) under attack.

Each accepted value must reach the program as one intact word: the real shell
runs the rendered line against recorders, ``setsid`` and ``env`` pass on to the
next program as the real ones would, and the test compares the argv, cwd and
environment that docker, docker compose and cargo saw with the raw values.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from fdl_tasks.build.backends.compose import compose_line
from fdl_tasks.build.backends.docker_run import docker_line
from fdl_tasks.build.backends.native import native_line
from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_environment import BuildJob
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.model import ComposeService, DockerSettings
from fdl_tasks.config.names import join_path
from fdl_tasks.config.variants import arch_cuda
from tests.unit.hostile.conftest import (
    cargo_tail,
    checked_command,
    checked_crate_dir,
    commands,
    crate_dirs,
    env_names,
    good_arches,
    label_segment,
    load,
    mostly,
    no_nul,
    one_worker,
    printable,
    sandbox,
)


def container(job: BuildJob) -> str:
    return "fdl-r1-" + job.name.replace("/", "-").lstrip("_")


def identity(job: BuildJob) -> list[str]:
    """The name and labels a run gives its containers."""
    return [
        "--name",
        container(job),
        "--label",
        "fdl-tasks.run=r1",
        "--label",
        f"fdl-tasks.job={job.name}",
    ]


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    label=mostly(label_segment),
    arch=mostly(good_arches),
    command=mostly(commands),
    crate=mostly(crate_dirs),
    shared=st.booleans(),
)
def test_native_command_shell_sees_every_value_as_one_word(
    recorders: Path, suffix: str, label: str, arch: str, command: str, crate: str, shared: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {"controller": {"path": path}, "workers": [one_worker(path, label, arch)]},
            "controller.path",
            "workers[0].",
        )
        name, crate_dir = checked_command(command), checked_crate_dir(crate)
        if cluster is None or name is None or crate_dir is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        os.makedirs(join_path(path, crate_dir), exist_ok=True)
        (job,) = plan_builds(cluster.workers, backend_for(cluster), name, crate_dir, shared)
        calls, _ = box.run(native_line(job, cluster.controller))
        base = path.rstrip("/")
        libtorch, target = f"{base}/libtorch/{arch}", f"{base}/{job.target_dir}"
        cwd = os.path.realpath(join_path(path, crate_dir))
        cargo = cargo_tail(name, arch)
        assert [(c.name, c.argv, c.cwd) for c in calls] == [
            (
                "setsid",
                ("env", f"LIBTORCH_PATH={libtorch}", f"CARGO_TARGET_DIR={target}", *cargo),
                cwd,
            ),
            ("env", (f"LIBTORCH_PATH={libtorch}", f"CARGO_TARGET_DIR={target}", *cargo), cwd),
            ("cargo", tuple(cargo[1:]), cwd),
        ]
        assert calls[0].ld_library_path is None
        assert calls[2].env["LIBTORCH_PATH"] == libtorch
        assert calls[2].env["CARGO_TARGET_DIR"] == target


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    workspace=printable,
    libtorch=printable,
    image=st.tuples(printable, st.booleans(), printable),
    run_args=st.lists(printable, max_size=3),
    # Hostile env names, arches, commands and crate dirs: the launch and native tests (the
    # docker settings alone already make most examples a refusal).
    env=st.dictionaries(env_names, no_nul, max_size=3),
    arch=good_arches,
    command=commands,
    crate=crate_dirs,
    user=st.sampled_from([None, "1000:1000"]),
)
def test_docker_command_argv_is_exactly_the_raw_values(
    recorders: Path,
    suffix: str,
    workspace: str,
    libtorch: str,
    image: tuple[str, bool, str],
    run_args: list[str],
    env: dict[str, str],
    arch: str,
    command: str,
    crate: str,
    user: str | None,
) -> None:
    before, after = (s.replace("{", "").replace("}", "") for s in (image[0], image[2]))
    templated = image[1]
    raw_image = before + ("{cuda_tag}" if templated else "") + after
    with sandbox(recorders) as box:
        path = box.path(suffix)
        docker = {
            "image": raw_image,
            "cuda_version": "12.8",
            "workspace": "/" + workspace,
            "libtorch": "/" + libtorch,
            "run_args": run_args,
            "env": env,
        }
        cluster = load(
            {
                "controller": {"path": path, "docker": docker},
                "workers": [one_worker("/w", "node-a", arch)],
            },
            "controller.",
            "workers[0].",
        )
        name, crate_dir = checked_command(command), checked_crate_dir(crate)
        if cluster is None or name is None or crate_dir is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        assert isinstance(cluster.controller.docker, DockerSettings)
        (job,) = plan_builds(cluster.workers, backend_for(cluster), name, crate_dir, True)
        calls, _ = box.run(
            docker_line(job, cluster.controller, cluster.controller.docker, "r1", user)
        )
        cuda = arch_cuda(arch)
        version = cuda.tag if cuda else "12.8"
        expected_image = before + (version if templated else "") + after
        ws = "/" + workspace
        variables = {
            "CARGO_TARGET_DIR": join_path(ws, job.target_dir),
            "LIBTORCH_PATH": f"/{libtorch}",
            **env,
        }
        expected = [
            "run",
            "--rm",
            *identity(job),
            *(["--user", user] if user else []),
            "-v",
            f"{path}:{ws}",
            "-v",
            f"{path.rstrip('/')}/libtorch/{arch}:/{libtorch}:ro",
            "-w",
            join_path(ws, crate_dir),
            "-e",
            f"CARGO_TARGET_DIR={variables['CARGO_TARGET_DIR']}",
            "-e",
            f"LIBTORCH_PATH=/{libtorch}",
            *[item for name, value in env.items() for item in ("-e", f"{name}={value}")],
            *run_args,
            expected_image,
            *cargo_tail(name, arch),
        ]
        assert [c.name for c in calls] == ["docker"]
        assert list(calls[0].argv) == expected
        # docker splits each -e at its first '=': the container gets exactly these variables.
        first = expected.index("-w") + 2
        flags = calls[0].argv[first : first + 2 * (2 + len(env))]
        assert flags[::2] == ("-e",) * (2 + len(env))
        assert dict(word.split("=", 1) for word in flags[1::2]) == variables


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    service=mostly(label_segment),
    arch=mostly(good_arches),
    command=mostly(commands),
    crate=mostly(crate_dirs),
    compose_argv=st.sampled_from([("docker", "compose"), ("docker-compose",)]),
    ids=st.tuples(st.integers(0, 2**31), st.integers(0, 2**31)),
)
def test_compose_command_and_its_inner_script_see_every_value_as_one_word(
    recorders: Path,
    suffix: str,
    service: str,
    arch: str,
    command: str,
    crate: str,
    compose_argv: tuple[str, ...],
    ids: tuple[int, int],
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {
                "controller": {"path": path, "docker": service},
                "workers": [one_worker("/w", "node-a", arch)],
            },
            "controller.",
            "workers[0].",
        )
        name, crate_dir = checked_command(command), checked_crate_dir(crate)
        if cluster is None or name is None or crate_dir is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        compose = cluster.controller.docker
        assert isinstance(compose, ComposeService) and compose.service == service
        os.makedirs(join_path(path, crate_dir), exist_ok=True)
        (job,) = plan_builds(cluster.workers, backend_for(cluster), name, crate_dir, True)
        # The service sees the project at its fixed workspace; here, a plain sandbox directory.
        workspace = str(box.root / "workspace")
        os.makedirs(join_path(workspace, crate_dir), exist_ok=True)
        mounted = attrs.evolve(compose, workspace=workspace)
        calls, _ = box.run(compose_line(job, cluster.controller, mounted, compose_argv, "r1", ids))
        root = os.path.realpath(path)
        assert [(c.name, c.cwd) for c in calls] == [("env", root), (compose_argv[0], root)]
        started = calls[1]
        *head, inner = started.argv
        assert head == [
            *compose_argv[1:],
            "run",
            "--rm",
            "-T",
            *identity(job),
            service,
            "bash",
            "-c",
        ]
        # flodl's variables, as env(1) handed them to docker compose.
        cuda = arch_cuda(arch)
        assert started.env["LIBTORCH_HOST_PATH"] == f"{path.rstrip('/')}/libtorch/{arch}"
        assert started.env.get("CUDA_TAG") == (cuda.tag if cuda else None)
        assert started.env.get("CUDA_VERSION") == (cuda.version if cuda else None)
        assert (started.env["UID"], started.env["GID"]) == tuple(map(str, ids))
        # What the service's bash then runs: cargo, in the crate, with the raw values.
        calls, _ = box.run(inner, shell="/bin/bash")
        assert [(c.name, c.argv, c.cwd) for c in calls] == [
            (
                "cargo",
                tuple(cargo_tail(name, arch)[1:]),
                os.path.realpath(join_path(workspace, crate_dir)),
            )
        ]
        assert calls[0].env["CARGO_TARGET_DIR"] == join_path(workspace, job.target_dir)
