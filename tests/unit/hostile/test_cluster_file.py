"""cluster.yaml's fields: one clean refusal naming the field, or the value kept verbatim.

Whether an accepted value is then safe is not judged here by a rule of what
"safe values" look like: the execution tests (build commands, remote scripts,
launch) run every accepted value through the real shell and look at what the
recorders saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fdl_tasks.build.backends.registry import backend_for
from fdl_tasks.build.build_plan import plan_builds
from fdl_tasks.config.model import Cluster, DockerSettings
from fdl_tasks.core.errors import FdlError
from tests.unit.hostile.conftest import (
    assert_one_paragraph,
    base_cluster,
    fragment,
    hostile,
    load,
    one_worker,
    yaml_keys,
    yaml_values,
)


@attrs.frozen
class Field:
    """Where a generated value goes in cluster.yaml and where it comes back out."""

    put: Callable[[dict[str, Any], Any], None]
    get: Callable[[Cluster], Any]


def _w(data: dict[str, Any]) -> dict[str, Any]:
    worker: dict[str, Any] = data["workers"][0]
    return worker


def _docker(data: dict[str, Any]) -> dict[str, Any]:
    docker: dict[str, Any] = data["controller"]["docker"]
    return docker


def _cross(data: dict[str, Any]) -> dict[str, Any]:
    setup: dict[str, Any] = data["controller"].setdefault("cross", {}).setdefault("aarch64", {})
    return setup


def _dk(cluster: Cluster) -> DockerSettings:
    docker = cluster.controller.docker
    assert isinstance(docker, DockerSettings)
    return docker


def _set(key: str, where: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., None]:
    def put(data: dict[str, Any], value: Any) -> None:
        where(data)[key] = value

    return put


def _cross_field(key: str) -> Field:
    return Field(_set(key, _cross), lambda c: getattr(c.controller.cross["aarch64"], key))


#: Keyed by the path the loader names in its messages.
FIELDS: dict[str, Field] = {
    "workers[0].host": Field(_set("host", _w), lambda c: c.workers[0].host),
    "workers[0].path": Field(_set("path", _w), lambda c: c.workers[0].path),
    "workers[0].data_path": Field(_set("data_path", _w), lambda c: c.workers[0].data_path),
    "workers[0].arch": Field(_set("arch", _w), lambda c: c.workers[0].arch),
    "workers[0].cpu_arch": Field(_set("cpu_arch", _w), lambda c: c.workers[0].cpu_arch),
    "controller.path": Field(_set("path", lambda d: d["controller"]), lambda c: c.controller.path),
    "controller.arch": Field(_set("arch", lambda d: d["controller"]), lambda c: c.controller.arch),
    "controller.data_path": Field(
        _set("data_path", lambda d: d["controller"]), lambda c: c.controller.data_path
    ),
    **{
        f"controller.cross['aarch64'].{key}": _cross_field(key)
        for key in ("target", "linker", "image", "service")
    },
    "controller.docker.image": Field(_set("image", _docker), lambda c: _dk(c).image),
    "controller.docker.workspace": Field(_set("workspace", _docker), lambda c: _dk(c).workspace),
    "controller.docker.libtorch": Field(_set("libtorch", _docker), lambda c: _dk(c).libtorch),
    "controller.docker.cuda_version": Field(
        _set("cuda_version", _docker), lambda c: _dk(c).cuda_version
    ),
    "controller.docker.run_args[0]": Field(
        lambda d, v: _docker(d).__setitem__("run_args", [v]), lambda c: _dk(c).run_args[0]
    ),
    "controller.docker.env['K']": Field(
        lambda d, v: _docker(d).__setitem__("env", {"K": v}), lambda c: _dk(c).env["K"]
    ),
    "workers[0].env['K']": Field(
        lambda d, v: _w(d).__setitem__("env", {"K": v}), lambda c: c.workers[0].env["K"]
    ),
    "env['K']": Field(lambda d, v: d.__setitem__("env", {"K": v}), lambda c: c.env["K"]),
    "workers[0].ssh.options[0]": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("options", [v]), lambda c: c.workers[0].ssh.options[0]
    ),
    "workers[0].ssh.target": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("target", v), lambda c: c.workers[0].ssh.target
    ),
    "workers[0].ssh.user": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("user", v), lambda c: c.workers[0].ssh.user
    ),
    "workers[0].ssh.identity_file": Field(
        lambda d, v: _w(d)["ssh"].__setitem__("identity_file", v),
        lambda c: c.workers[0].ssh.identity_file,
    ),
}

ENV_NAME_FIELDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "env": lambda d: d,
    "workers[0].env": _w,
    "controller.docker.env": _docker,
}


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(sorted(FIELDS)), value=yaml_values)
@example(field="env['K']", value="a\x00b")
@example(field="workers[0].env['K']", value="a\nb; touch PWNED")
@example(field="workers[0].path", value="/a\nb")
@example(field="workers[0].host", value="../x")
@example(field="workers[0].host", value="a/b")
@example(field="workers[0].arch", value="../x")
@example(field="workers[0].arch", value="/abs")
@example(field="controller.arch", value="a//b")
@example(field="workers[0].ssh.options[0]", value="ProxyJump=a\nProxyCommand=touch PWNED")
@example(field="controller.docker.run_args[0]", value="--x\x1b[31m")
def test_loader_rejects_with_fdl_error_or_keeps_the_value_verbatim(field: str, value: Any) -> None:
    spec = FIELDS[field]
    data = base_cluster()
    spec.put(data, value)
    cluster = load(data, field)
    if cluster is None:
        return
    got = spec.get(cluster)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    assert got == (str(value) if numeric and "env" in field else value)


@settings(max_examples=150, deadline=None)
@given(where=st.sampled_from(sorted(ENV_NAME_FIELDS)), name=yaml_keys, value=hostile)
def test_env_names_are_kept_or_rejected(where: str, name: Any, value: str) -> None:
    """Accepted names reach the process intact: see the launch and docker tests."""
    data = base_cluster()
    ENV_NAME_FIELDS[where](data)["env"] = {name: value}
    cluster = load(data, f"{where}[")
    if cluster is None:
        return
    envs = {
        "env": cluster.env,
        "workers[0].env": cluster.workers[0].env,
        "controller.docker.env": _dk(cluster).env,
    }
    assert list(envs[where]) == [name]


def test_a_key_holding_at_sign_is_named_in_the_refusal() -> None:
    """cattrs renders 'message @ path'; a key holding ' @ ' once made it name a wrong path."""
    data = base_cluster()
    data["env"] = {"a @ b": "x"}
    assert load(data, "env['a @ b']") is None


@settings(max_examples=100, deadline=None)
@given(document=st.recursive(yaml_values, lambda inner: st.lists(inner, max_size=3), max_leaves=8))
def test_any_document_shape_gives_fdl_error_never_a_crash(document: Any) -> None:
    load(document)
    load({"controller": document, "workers": [document]})
    load({"cluster": {"controller": {"path": "/p"}, "workers": document}})


# ---------------------------------------------------------------------------
# docker image templates: only FdlError


@settings(max_examples=150, deadline=None)
@given(
    image=st.lists(
        st.one_of(
            fragment,
            st.sampled_from(
                [
                    *("{cuda_version}", "{cuda_tag}", "{}", "{0}", "{nope}", "{", "}", "{{", "}}"),
                    *("{cuda_tag!z}", "{cuda_version:d}", "{cuda_tag:>}", "{.}"),
                ]
            ),
        ),
        max_size=5,
    ).map("".join),
    arch=st.sampled_from(["precompiled/cu128", "precompiled/cpu", "builds/sm61-sm120"]),
    default=st.sampled_from([None, "12.8", "{}"]),
)
def test_docker_image_template_gives_fdl_error_or_an_image(
    image: str, arch: str, default: str | None
) -> None:
    docker = {"image": image, "cuda_version": default}
    cluster = load(
        {"controller": {"path": "/p", "docker": docker}, "workers": [one_worker("/w", arch=arch)]},
        "controller.docker.",
    )
    if cluster is None:
        return
    try:
        jobs = plan_builds(cluster.workers, backend_for(cluster), "x", "", True)
    except FdlError as exc:
        assert_one_paragraph(str(exc))
        return
    assert all(isinstance(job.build.environment.toolchain, str) for job in jobs)


@pytest.mark.parametrize(
    "image", ["img:{cuda_tag.x}", "img:{cuda_version[a]}", "img:{cuda_tag:>99999999999999}"]
)
def test_docker_image_template_attribute_lookup(image: str) -> None:
    """Lookups and widths in a template once escaped as AttributeError/MemoryError."""
    cluster = load(
        {"controller": {"path": "/p", "docker": {"image": image}}, "workers": [one_worker("/w")]},
        "controller.docker.image",
    )
    assert cluster is None
