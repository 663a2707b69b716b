"""``--timings`` through the real ``inv``: the page of a run, in every build mode and in --watch.

Real sshd hosts on loopback, real docker and docker compose, real cargo; the
page's data is read back from the JSON it embeds, and every host and build
environment of the run must be in it with durations that fit the run.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fdl_tasks.timings.timings_html import page_data
from rig.harness import RigCluster, Running, start_rig
from rig.project import FIXTURE_DIR, write_compose_file
from rig.sshrig import HostSpec

pytestmark = [pytest.mark.rig, pytest.mark.docker]

HOSTS = [
    HostSpec("t-one", "127.0.0.190"),
    HostSpec("t-two", "127.0.0.191"),
    HostSpec("t-cpu", "127.0.0.192"),
]
#: t-one and t-two share one build: two build environments for three hosts.
ARCHS = {"t-one": "precompiled/cu128", "t-two": "precompiled/cu128", "t-cpu": "precompiled/cpu"}
ENV = {"INVOKE_FDL_COMPILE_CACHE": "0"}
PAGE = re.compile(r"timings of this run: (\S+\.html)$", re.MULTILINE)
MAIN_RS = "ddp-bench/src/main.rs"
MANIFEST = "ddp-bench/Cargo.toml"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigCluster]:
    variants = sorted(set(ARCHS.values()))
    with start_rig(tmp_path_factory.mktemp("timings"), HOSTS, variants, docker=True) as cluster:
        write_compose_file(cluster.project)
        yield cluster


@pytest.fixture(autouse=True)
def fresh(rig: RigCluster) -> Iterator[None]:
    for source in (MAIN_RS, MANIFEST):
        shutil.copyfile(FIXTURE_DIR / source, rig.project / source)
    shutil.rmtree(rig.project / "target", ignore_errors=True)
    yield
    Running.stop_all()


def cluster_file(rig: RigCluster, name: str, **controller: Any) -> Path:
    workers = [rig.worker(host, arch=arch) for host, arch in ARCHS.items()]
    return rig.write(workers, name, **controller)


def read_page(path: Path) -> dict[str, Any]:
    data = page_data(path.read_text(encoding="utf-8"))
    assert data is not None, path
    return data


def check_run(rig: RigCluster, data: dict[str, Any], wall: float, builds: int) -> None:
    """Every host and build environment with its spans; each fits the run's wall time."""
    assert 0 < data["wall"] <= wall
    spans = data["spans"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        assert 0 <= span["start"] <= span["end"] <= data["wall"], span
        assert span["seconds"] >= 0 and span["ok"], span
        by_kind.setdefault(span["kind"], []).append(span)
    hosts = sorted(ARCHS)
    controller = sorted(s["name"] for s in by_kind["preflight"] if s["name"] not in ARCHS)
    assert len(controller) == 1  # the controller's local probe
    assert sorted(s["name"] for s in by_kind["preflight"] if s["name"] in ARCHS) == hosts
    assert sorted(s["name"] for s in by_kind["verify"]) == hosts
    built = by_kind["build"]
    assert len(built) == builds
    assert sorted(h for s in built for h in s["hosts"]) == hosts
    for span in built:  # cargo's own report of each build, next to the page
        report = (rig.project / "target/cluster/_timings" / span["link"]).resolve()
        assert report.is_file() and "cargo-timing" in report.name, span
    assert [s["name"] for s in by_kind["publish"]] == ["ddp-bench"]
    # The steps follow one another, but a host is verified as soon as its own build ends.
    ends = {host: span["end"] for span in built for host in span["hosts"]}
    assert all(span["start"] >= ends[span["name"]] for span in by_kind["verify"])
    assert max(s["end"] for s in by_kind["preflight"]) <= min(s["start"] for s in built)
    assert max(s["end"] for s in by_kind["verify"]) <= by_kind["publish"][0]["start"]
    order = ["preflight", "build", "verify", "publish"]
    starts = [min(s["start"] for s in by_kind[kind]) for kind in order]
    assert starts == sorted(starts)


def timed_prebuild(rig: RigCluster, path: Path) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    done = rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--timings", "--cluster-file", str(path), env=ENV
    )
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    found = PAGE.findall(done.stderr)
    assert len(found) == 1, done.stderr
    page = Path(found[0])
    assert page.parent == rig.project / "target/cluster/_timings"
    return read_page(page), wall


@pytest.mark.parametrize("mode", ["docker run", "docker compose run", "native cargo"])
def test_the_page_holds_every_host_and_build(rig: RigCluster, mode: str) -> None:
    settings: dict[str, dict[str, Any]] = {
        "docker run": {"docker": rig.docker_settings()},
        "docker compose run": {"docker": "cuda"},
        "native cargo": {},
    }
    controller = settings[mode]
    path = cluster_file(rig, f"{mode.replace(' ', '-')}.yaml", **controller)
    data, wall = timed_prebuild(rig, path)
    assert data["mode"] == mode and data["task"] == "prebuild" and data["ok"]
    check_run(rig, data, wall, builds=2)


def test_a_failed_build_still_writes_its_page(rig: RigCluster) -> None:
    main = rig.project / MAIN_RS
    main.write_text(main.read_text() + "\nfn broken( {}\n")
    path = cluster_file(rig, "broken.yaml", docker=rig.docker_settings())
    done = rig.inv(
        "prebuild", "--cmd", "ddp-bench", "--timings", "--cluster-file", str(path), env=ENV
    )
    assert done.returncode == 1, done.stderr
    data = read_page(Path(PAGE.findall(done.stderr)[0]))
    assert data["ok"] is False
    builds = [s for s in data["spans"] if s["kind"] == "build"]
    assert len(builds) == 2 and not any(s["ok"] for s in builds)
    assert not any(s["kind"] in ("verify", "publish") for s in data["spans"])


def test_watch_writes_one_page_per_cycle(rig: RigCluster) -> None:
    path = cluster_file(rig, "watch.yaml", docker=rig.docker_settings())
    started = time.monotonic()
    args = ["prebuild", "--cmd", "ddp-bench", "--watch", "--timings", "--cluster-file", str(path)]
    run = rig.background(*args, env=ENV)
    pages = rig.project / "target/cluster/_timings"

    def cycle_done(number: int) -> bool:
        return any(line.startswith(f"watch: cycle {number} ok") for _, line in run.lines)

    run.wait_for(lambda: cycle_done(1), 240)
    main = rig.project / MAIN_RS
    main.write_text(main.read_text().replace('cuda={cuda}");', 'cuda={cuda} rev=t");'))
    run.wait_for(lambda: cycle_done(2), 120)
    wall = time.monotonic() - started
    assert run.stop() == 130, run.stderr
    written = sorted(pages.glob("ddp-bench-*.html"))
    assert len(written) == 2, run.stderr
    assert [str(p) for p in written] == PAGE.findall(run.stderr)
    first, second = (read_page(p) for p in written)
    check_run(rig, first, wall, builds=2)
    # A watch cycle skips preflight; it still builds, verifies and publishes every host.
    assert not any(s["kind"] == "preflight" for s in second["spans"])
    assert sorted(s["name"] for s in second["spans"] if s["kind"] == "verify") == sorted(ARCHS)
    assert len([s for s in second["spans"] if s["kind"] == "build"]) == 2
    assert first["wall"] + second["wall"] <= wall


def test_no_page_without_the_option(rig: RigCluster) -> None:
    path = cluster_file(rig, "plain.yaml", docker=rig.docker_settings())
    done = rig.inv("prebuild", "--cmd", "ddp-bench", "--cluster-file", str(path), env=ENV)
    assert done.returncode == 0, done.stderr
    assert not PAGE.search(done.stderr)
    assert not (rig.project / "target/cluster/_timings").exists()
    assert not list((rig.project / "target/cluster").rglob("cargo-timing*.html"))


def test_build_host_writes_its_page(rig: RigCluster) -> None:
    path = cluster_file(rig, "one-host.yaml", docker=rig.docker_settings())
    args = ["build-host", "--host", "t-cpu", "--cmd", "ddp-bench", "--timings"]
    done = rig.inv(*args, "--cluster-file", str(path), env=ENV)
    assert done.returncode == 0, done.stderr
    data = read_page(Path(PAGE.findall(done.stderr)[0]))
    assert data["task"] == "build-host"
    kinds = [(s["kind"], s["name"]) for s in data["spans"]]
    probed = sorted(kinds[:2])  # its own preflight: the controller and its one host
    assert probed == [("preflight", "ctrl"), ("preflight", "t-cpu")], kinds
    assert kinds[2:] == [("build", "t-cpu"), ("verify", "t-cpu"), ("publish", "ddp-bench")]
    assert all(0 <= s["start"] <= s["end"] <= data["wall"] for s in data["spans"])


def build_starts(data: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, end) of each build of a page, by start."""
    return sorted((s["start"], s["end"]) for s in data["spans"] if s["kind"] == "build")


def test_a_dependency_change_with_the_cache_builds_one_first(
    rig: RigCluster, tmp_path: Path
) -> None:
    """With the compile cache, a changed manifest gives one build a head start (it fills
    the cache for the others); an edit of the code starts every build at once.
    The builds' spans on the page show the order."""
    archs = {"t-one": "precompiled/cu128", "t-cpu": "precompiled/cpu"}
    workers = [rig.worker(host, arch=arch) for host, arch in archs.items()]
    path = rig.write(workers, "cached.yaml", docker=rig.docker_settings())
    env = {"INVOKE_FDL_COMPILE_CACHE_DIR": str(tmp_path / "sccache")}
    args = ["prebuild", "--cmd", "ddp-bench", "--timings", "--cluster-file", str(path)]

    def prebuild() -> list[tuple[float, float]]:
        done = rig.inv(*args, env=env)
        assert done.returncode == 0, done.stderr
        return build_starts(read_page(Path(PAGE.findall(done.stderr)[-1])))

    prebuild()  # cold: every target dir built
    main = rig.project / MAIN_RS
    main.write_text(main.read_text().replace('cuda={cuda}");', 'cuda={cuda} rev=d");'))
    (first, _), (second, _) = prebuild()
    assert second - first < 0.5  # together
    manifest = rig.project / MANIFEST
    manifest.write_text(manifest.read_text() + "\n")
    (_, first_end), (second, _) = prebuild()
    assert second >= first_end  # the second waited for the first
