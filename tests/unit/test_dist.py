"""Distributed compiles (``controller.dist``): the settings, the client files, the wrapper,
the scheduler check and the counts, without a real scheduler (a fake one on loopback).

The rig test (:mod:`tests.rig.test_dist`) runs the real sccache-dist.
"""

from __future__ import annotations

import http.server
import os
import socket
import stat
import subprocess
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fdl_tasks.cache.cache_stats import (
    DIST_STATUS_FILE,
    FALLBACKS_FILE,
    STATS_FILE,
    CacheStats,
    read_stats,
)
from fdl_tasks.cache.compile_cache import (
    CONTAINER_SCCACHE,
    CONTAINER_WRAPPER,
    CompileCache,
    find_cache,
    open_cache,
    with_stats,
)
from fdl_tasks.cache.dist import (
    WRAPPER_SCRIPT,
    client_config,
    is_loopback_url,
    parse_dist_status,
    parse_scheduler_status,
    toml_string,
)
from fdl_tasks.cache.dist_io import CONTAINER_COMPILER_PACKAGES, CONTAINER_DIST, DistClient
from fdl_tasks.config.loader import parse_cluster
from fdl_tasks.config.model import DistSettings
from fdl_tasks.core.errors import FdlError
from fdl_tasks.core.reporting import collect

SECRET = "s3cr3t-Token_value.42"


def cluster(dist: object) -> dict[str, object]:
    return {"controller": {"path": "/srv/p", "dist": dist}, "workers": []}


def load_error(dist: object) -> str:
    with pytest.raises(FdlError) as caught:
        parse_cluster(cluster(dist), "c.yaml")
    return str(caught.value)


# ----------------------------------------------------------------------------- settings


def test_a_dist_block_is_structured() -> None:
    dist = {"scheduler_url": "https://sccache.example.org:10600", "token_file": "~/.sd.token"}
    parsed = parse_cluster(cluster(dist), "c.yaml").controller.dist
    assert parsed == DistSettings("https://sccache.example.org:10600", token_file="~/.sd.token")
    by_env = {"scheduler_url": "http://10.0.0.5:10600", "token_env": "SCCACHE_DIST_TOKEN"}
    parsed = parse_cluster(cluster(by_env), "c.yaml").controller.dist
    assert parsed is not None and parsed.token_env == "SCCACHE_DIST_TOKEN"


def test_without_a_dist_block_nothing_changes() -> None:
    assert parse_cluster(cluster(None), "c.yaml").controller.dist is None


@pytest.mark.parametrize(
    ("dist", "expected"),
    [
        (
            {"scheduler_url": "ftp://x:1", "token_env": "T"},
            "c.yaml is not a valid cluster file: controller.dist.scheduler_url: scheduler URL "
            "'ftp://x:1' must be the scheduler's URL such as 'http://10.0.0.5:10600'",
        ),
        ({"scheduler_url": "http://:10600", "token_env": "T"}, "scheduler URL 'http://:10600'"),
        ({"scheduler_url": "http://h:99999", "token_env": "T"}, "scheduler URL 'http://h:99999'"),
        ({"scheduler_url": "http://h/ x", "token_env": "T"}, "scheduler URL 'http://h/ x'"),
        ({"scheduler_url": 10600, "token_env": "T"}, "scheduler_url: expected a string"),
        ({"token_env": "T"}, "controller.dist.scheduler_url: required key missing"),
        (
            {"scheduler_url": "http://h:1"},
            "controller.dist: the client token is missing: set token_file",
        ),
        (
            {"scheduler_url": "http://h:1", "token_file": "/t", "token_env": "T"},
            "controller.dist: set token_file or token_env, not both.",
        ),
        (
            {"scheduler_url": "http://h:1", "token_file": "dist.token"},
            "controller.dist.token_file: expected a file on the controller: an absolute path "
            "or one starting with '~/'",
        ),
        (
            {"scheduler_url": "http://h:1", "token_env": "A B"},
            "controller.dist.token_env: 'A B' is not a valid environment variable name",
        ),
        (
            {"scheduler_url": "http://h:1", "token_env": "T", "token": "x"},
            "controller.dist: unknown key(s) token; expected one of: scheduler_url, token_file, "
            "token_env",
        ),
    ],
)
def test_bad_dist_blocks_are_one_paragraph_with_the_key_path(dist: object, expected: str) -> None:
    message = load_error(dist)
    assert expected in message, message
    assert "\n" not in message


def test_a_url_with_a_password_is_refused_without_showing_it() -> None:
    message = load_error({"scheduler_url": f"http://me:{SECRET}@h:10600", "token_env": "T"})
    assert "must not carry a user or a password" in message
    assert SECRET not in message and "me:" not in message


def test_loopback_urls_are_recognised() -> None:
    assert is_loopback_url("http://127.0.0.1:10600")
    assert is_loopback_url("http://127.3.2.1:10600")
    assert is_loopback_url("http://localhost:10600")
    assert is_loopback_url("http://[::1]:10600")
    assert not is_loopback_url("http://10.0.0.5:10600")
    assert not is_loopback_url("https://sccache.example.org")


# ----------------------------------------------------------------------------- client files


def test_client_config_is_valid_toml_with_every_value_escaped() -> None:
    text = client_config('http://h:1/a"b', 'to"k\\en', "/tc dir")
    parsed = tomllib.loads(text)
    assert parsed["dist"] == {
        "scheduler_url": 'http://h:1/a"b',
        "toolchains": [],
        "cache_dir": "/tc dir",
        "auth": {"type": "token", "token": 'to"k\\en'},
    }
    controls = "a\x01\x7fb"
    assert tomllib.loads("x = " + toml_string(controls))["x"] == controls


def dist_cache(tmp_path: Path, token_env: str | None = None) -> CompileCache:
    client = DistClient("http://127.0.0.1:10600", str(tmp_path / "c-dist"), token_env)
    return CompileCache("/opt/bin/sccache", str(tmp_path / "c"), "10G", client)


def test_container_wiring_mounts_the_client_read_only(tmp_path: Path) -> None:
    cache = dist_cache(tmp_path)
    assert cache.container_mounts()[3:] == [
        f"{tmp_path}/c-dist/container:{CONTAINER_DIST}:ro",
        f"{tmp_path}/c-dist/toolchains/container:{CONTAINER_COMPILER_PACKAGES}",
    ]
    variables = cache.container_variables("/tmp/s.sock")
    assert variables["RUSTC_WRAPPER"] == f"{CONTAINER_DIST}/sccache"
    assert variables["FDL_SCCACHE"] == CONTAINER_SCCACHE
    assert variables["SCCACHE_CONF"] == f"{CONTAINER_DIST}/client.toml"
    assert cache.container_run_args() == ["--network", "host"]
    assert cache.container_run_args(["--network=bridge"]) == []
    remote = CompileCache("/b", "/c", "1G", DistClient("http://10.0.0.5:10600", "/c-dist"))
    assert remote.container_run_args() == []


def test_without_dist_the_wiring_is_unchanged(tmp_path: Path) -> None:
    plain = CompileCache("/opt/bin/sccache", str(tmp_path / "c"), "10G")
    assert plain.container_variables("/s")["RUSTC_WRAPPER"] == CONTAINER_WRAPPER
    assert plain.container_variables("/s")["FDL_SCCACHE"] == CONTAINER_SCCACHE
    native = plain.native_variables("/s")
    assert "SCCACHE_CONF" not in native
    assert native["RUSTC_WRAPPER"] == f"{tmp_path}/c-wrapper/sccache"
    assert len(plain.container_mounts()) == 3 and plain.container_run_args() == []


def test_native_builds_never_see_the_token_variable(tmp_path: Path) -> None:
    variables = dist_cache(tmp_path, token_env="SD_TOKEN").native_variables("/tmp/s.sock")
    assert variables["SD_TOKEN"] == ""
    assert variables["RUSTC_WRAPPER"] == f"{tmp_path}/c-dist/native/sccache"
    assert variables["SCCACHE_CONF"] == f"{tmp_path}/c-dist/native/client.toml"
    assert variables["FDL_SCCACHE"] == "/opt/bin/sccache"


# ----------------------------------------------------------------------------- the wrapper


@pytest.fixture
def wrapper(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the wrapper with a fake sccache that exits with ``$FAKE_STATUS``."""
    script = tmp_path / "sccache"
    script.write_text(WRAPPER_SCRIPT)
    script.chmod(0o755)
    fake = tmp_path / "real-sccache"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >>{tmp_path}/calls\n'
        'echo "remote out $*"; echo "remote err" >&2; '
        'cat >/dev/null; exit "${FAKE_STATUS:-0}"\n'
    )
    fake.chmod(0o755)

    def run(
        *args: str, status: int = 0, stdin: str = "", lock: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ["PATH"],
            "FDL_SCCACHE": str(fake),
            "FAKE_STATUS": str(status),
            "SCCACHE_SERVER_UDS": str(tmp_path / "srv.sock"),
            "TMPDIR": str(tmp_path),
            **({"FDL_DIST_LOCK": str(tmp_path / "start.lock")} if lock else {}),
        }
        return subprocess.run(
            [str(script), *args], input=stdin, env=env, capture_output=True, text=True, check=False
        )

    return run


def test_the_wrapper_passes_a_successful_attempt_through(
    wrapper: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    done = wrapper("/bin/echo", "--crate-name", "dep0", "x.rs")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "remote out /bin/echo --crate-name dep0 x.rs\n",
        "remote err\n",
    )
    assert not (tmp_path / "srv.sock.fallbacks").exists()
    assert not list(tmp_path.glob("fdl-dist.*"))  # its temporary files are gone


def test_the_wrapper_compiles_locally_what_failed_and_names_the_unit(
    wrapper: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    done = wrapper("/bin/echo", "--crate-name", "blind", "src/lib.rs", status=254)
    # The failed attempt's output is dropped: the local compile's is what cargo reads.
    assert done.returncode == 0 and done.stdout == "--crate-name blind src/lib.rs\n"
    assert "remote" not in done.stdout + done.stderr
    assert "fdl-tasks: blind: compiling through sccache failed (exit 254)" in done.stderr
    assert (tmp_path / "srv.sock.fallbacks").read_text() == "blind\n"
    failing = wrapper("/bin/false", "--crate-name", "bad", status=1)
    assert failing.returncode == 1  # a genuine error stays one, reported by the compiler
    c_unit = wrapper("/bin/true", "-c", "shim.c", "-o", "/out/dir/shim.o", status=2)
    assert c_unit.returncode == 0
    assert (tmp_path / "srv.sock.fallbacks").read_text() == "blind\nbad\nshim.o\n"
    assert not list(tmp_path.glob("fdl-dist.*"))


def test_the_wrapper_starts_the_server_under_the_lock_once(
    wrapper: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Servers sharing the toolchain store start one at a time (sccache empties its
    scratch directory on start); a running server is not started again."""
    assert wrapper("/bin/true", "--crate-name", "a", lock=True).returncode == 0
    assert (tmp_path / "calls").read_text().splitlines() == [
        "--start-server",
        "/bin/true --crate-name a",
    ]
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "srv.sock"))
    try:
        assert wrapper("/bin/true", "--crate-name", "b", lock=True).returncode == 0
    finally:
        listener.close()
    assert (tmp_path / "calls").read_text().splitlines()[2:] == ["/bin/true --crate-name b"]


def test_the_wrapper_leaves_standard_input_compiles_to_sccache(
    wrapper: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Standard input cannot be read twice: such a probe is never retried."""
    done = wrapper("rustc", "-", "--crate-name", "___", status=1, stdin="fn main() {}")
    assert done.returncode == 1 and done.stdout.startswith("remote out")
    assert not (tmp_path / "srv.sock.fallbacks").exists()


# ----------------------------------------------------------------------------- counts


def test_with_stats_keeps_the_dist_status_and_the_fallbacks(tmp_path: Path) -> None:
    fake = tmp_path / "sccache"
    fake.write_text(
        "#!/bin/sh\ncase $1 in\n"
        "  --show-stats) echo '{\"stats\": {}}' ;;\n"
        '  --dist-status) echo \'{"SchedulerStatus":["u",{}]}\' ;;\nesac\n'
    )
    fake.chmod(0o755)
    target = tmp_path / "target"
    target.mkdir()
    (target / FALLBACKS_FILE).write_text("stale\n")
    server = tmp_path / "srv.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(server))
    build = f"(echo blind >{server}.fallbacks; exit 3)"
    env = {"PATH": os.environ["PATH"], "SCCACHE_SERVER_UDS": str(server), "SCCACHE_CONF": "/c"}
    done = subprocess.run(
        ["sh", "-c", with_stats(build, str(fake), str(target))], env=env, check=False
    )
    listener.close()
    assert done.returncode == 3
    assert (target / FALLBACKS_FILE).read_text() == "blind\n"
    assert parse_dist_status((target / DIST_STATUS_FILE).read_text()) == "SchedulerStatus"
    assert (target / STATS_FILE).read_text() == '{"stats": {}}\n'
    assert not Path(f"{server}.fallbacks").exists()


def stats_json(hits: int, misses: int, remote: int, errors: int = 0) -> str:
    return (
        f'{{"stats": {{"cache_hits": {{"counts": {{"Rust": {hits}}}}}, '
        f'"cache_misses": {{"counts": {{"Rust": {misses}}}}}, '
        f'"dist_compiles": {{"127.0.0.1:10501": {remote}}}, "dist_errors": {errors}}}}}'
    )


def test_read_stats_counts_remote_compiles_next_to_hits(tmp_path: Path) -> None:
    (tmp_path / STATS_FILE).write_text(stats_json(2, 5, 6))
    assert read_stats(tmp_path) == CacheStats(2, 5, 0, None, 6, 0, ())
    (tmp_path / DIST_STATUS_FILE).write_text('{"SchedulerStatus":["u",{}]}')
    (tmp_path / FALLBACKS_FILE).write_text("blind\nblind\n")
    stats = read_stats(tmp_path)
    assert stats == CacheStats(2, 5, 0, "SchedulerStatus", 6, 0, ("blind",))
    assert stats.describe() == "2/7 hits, dist 5/6, compiled locally after a failure: blind"


@pytest.mark.parametrize(
    ("stats", "text"),
    [
        (CacheStats(0, 5, 0, "SchedulerStatus", 5), "0/5 hits, dist 5/5"),
        (
            CacheStats(4, 1, 0, "SchedulerStatus", 0, 1),
            "4/5 hits, dist 0/1 (1 failed remotely, compiled here)",
        ),
        (
            CacheStats(0, 5, 0, "NotConnected", 0),
            "0/5 hits, dist 0/5 (scheduler unreachable from the build)",
        ),
        (CacheStats(5, 0, 0, "SchedulerStatus", 0), "5/5 hits"),
        (CacheStats(0, 5, 0, "Disabled", 0), "0/5 hits"),
        (CacheStats(0, 5, 1), "0/5 hits, 1 write errors"),
        (
            CacheStats(0, 1, 0, "SchedulerStatus", 0, 0, ("a", "b", "c", "d")),
            "0/1 hits, dist 0/5, compiled locally after a failure: a, b, c and 1 more",
        ),
    ],
)
def test_the_cache_column(stats: CacheStats, text: str) -> None:
    assert stats.describe() == text


def test_status_answers_are_read_or_left_alone() -> None:
    status = parse_scheduler_status(bytes([2] + [0] * 7 + [16] + [0] * 15))
    assert status is not None and status.describe() == "2 build servers, 16 CPUs"
    assert parse_scheduler_status(b"{}") is None
    assert parse_dist_status('{"NotConnected":["u","x"]}') == "NotConnected"
    assert parse_dist_status("") is None


# ----------------------------------------------------------------------------- opening


class FakeScheduler(http.server.BaseHTTPRequestHandler):
    """``status`` answers 1 server, 2 CPUs; ``alloc_job`` checks the bearer token."""

    token = SECRET

    def do_GET(self) -> None:
        body = bytes([1] + [0] * 7 + [2] + [0] * 15)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        accepted = self.headers.get("Authorization") == f"Bearer {self.token}"
        body = b"" if accepted else b"Fixed token mismatch"
        self.send_response(400 if accepted else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scheduler() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeScheduler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "dist.token"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def test_open_cache_writes_private_client_files(
    tmp_path: Path, scheduler: str, token_file: Path
) -> None:
    lines: list[str] = []
    dist = DistSettings(scheduler, token_file=str(token_file))
    cache = open_cache(str(tmp_path / "c"), "1G", dist, collect(lines))
    if cache is None:
        pytest.skip("sccache is not installed")
    assert cache.dist is not None and cache.dist.status is not None
    assert lines == [
        f"compile cache: distributed compiles through the sccache-dist scheduler at {scheduler} "
        "(1 build server, 2 CPUs); a unit whose remote compile fails is compiled locally"
    ]
    root = tmp_path / "c-dist"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for side, toolchains in (
        ("native", str(root / "toolchains" / "native")),
        ("container", "/fdl-sccache-toolchains"),
    ):
        config = root / side / "client.toml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        parsed = tomllib.loads(config.read_text())["dist"]
        assert parsed["auth"]["token"] == SECRET and parsed["cache_dir"] == toolchains
        assert os.access(root / side / "sccache", os.X_OK)
    assert not any(SECRET in line for line in lines)


def test_a_refused_token_fails_before_any_build_without_showing_it(
    tmp_path: Path, scheduler: str, token_file: Path
) -> None:
    token_file.write_text("not-the-token\n")
    dist = DistSettings(scheduler, token_file=str(token_file))
    with pytest.raises(FdlError) as caught:
        if open_cache(str(tmp_path / "c"), "1G", dist) is None:
            pytest.skip("sccache is not installed")
    message = str(caught.value)
    assert f"scheduler at {scheduler} refused the client token from controller.dist." in message
    assert "HTTP 401: Fixed token mismatch" in message and "not-the-token" not in message
    assert not (tmp_path / "c-dist" / "native" / "client.toml").exists()


def test_a_scheduler_that_does_not_answer_leaves_compiles_local(
    tmp_path: Path, token_file: Path
) -> None:
    lines: list[str] = []
    url = f"http://127.0.0.1:{closed_port()}"
    cache = open_cache(
        str(tmp_path / "c"), "1G", DistSettings(url, str(token_file)), collect(lines)
    )
    if cache is None:
        pytest.skip("sccache is not installed")
    assert cache.dist is None
    assert len(lines) == 1 and lines[0].startswith(
        f"warning: the sccache-dist scheduler at {url} does not answer ("
    )
    assert "this run compiles locally (with the cache)" in lines[0]


def test_token_sources_fail_clearly(
    tmp_path: Path, scheduler: str, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_cache(str(tmp_path / "c"), "1G") is None:
        pytest.skip("sccache is not installed")
    missing = DistSettings(scheduler, token_file=str(tmp_path / "none"))
    with pytest.raises(FdlError, match=r"token_file .*/none: cannot read .*No such file"):
        open_cache(str(tmp_path / "c"), "1G", missing)
    monkeypatch.delenv("FDL_TEST_TOKEN", raising=False)
    by_env = DistSettings(scheduler, token_env="FDL_TEST_TOKEN")
    with pytest.raises(FdlError, match=r"token_env \$FDL_TEST_TOKEN: the variable is not set"):
        open_cache(str(tmp_path / "c"), "1G", by_env)
    monkeypatch.setenv("FDL_TEST_TOKEN", "two words")
    with pytest.raises(FdlError) as caught:
        open_cache(str(tmp_path / "c"), "1G", by_env)
    assert "holds characters a token cannot carry" in str(caught.value)
    assert "two words" not in str(caught.value)
    monkeypatch.setenv("FDL_TEST_TOKEN", SECRET)
    cache = open_cache(str(tmp_path / "c"), "1G", by_env)
    assert cache is not None and cache.dist is not None
    token_file.chmod(0o644)
    lines: list[str] = []
    open_cache(str(tmp_path / "c"), "1G", DistSettings(scheduler, str(token_file)), collect(lines))
    assert lines[0].startswith("warning: controller.dist.token_file ")
    assert "is readable by other users (mode 644); chmod 600" in lines[0]


def test_dry_runs_create_and_read_nothing(tmp_path: Path) -> None:
    dist = DistSettings("http://127.0.0.1:1", token_file=str(tmp_path / "absent"))
    cache = find_cache(str(tmp_path / "c"), "1G", dist)
    if cache is None:
        pytest.skip("sccache is not installed")
    assert cache.dist is not None and cache.dist.directory == f"{tmp_path}/c-dist"
    assert list(tmp_path.iterdir()) == []
