"""The Engine API client against a real HTTP server on a unix socket, speaking as the
daemon does: what each answer becomes, what each request carries. (The rig tests ask
the real daemon: a missing image, an upper-case reference, no daemon at all.)"""

from __future__ import annotations

import json
import socketserver
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from fdl_tasks.build.docker_api import (
    DockerApi,
    DockerRefused,
    DockerUnreachable,
    container_name,
    labels_of,
)

#: (method, path) → (status, body) the fake daemon answers; anything else is a 404.
ANSWERS: dict[tuple[str, str], tuple[int, bytes]] = {
    ("GET", "/_ping"): (200, b"OK"),
    ("GET", "/images/registry:5000/team/builder:12.8/json"): (200, b'{"Id": "sha256:ab"}'),
    ("GET", "/images/Upper:1/json"): (400, b'{"message": "invalid reference format"}'),
    ("GET", "/containers/fdl-warm-1/json"): (
        200,
        b'{"Name": "/fdl-warm-1", "State": {"Status": "running"}, '
        b'"Config": {"Labels": {"fdl-tasks.warm": "/srv"}}}',
    ),
    ("GET", "/containers/json"): (
        200,
        b'[{"Id": "0123456789abcdef", "Names": ["/fdl-warm-2"], "Labels": {"k": "v"}}]',
    ),
    ("DELETE", "/containers/fdl-warm-2"): (204, b""),
    ("DELETE", "/containers/busy"): (500, b"driver failed: device busy"),
}


class Daemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    requests_seen: list[tuple[str, str, dict[str, list[str]]]]


class Handler(BaseHTTPRequestHandler):
    server: Daemon

    def address_string(self) -> str:  # a unix socket's peer has no host
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def answer(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        self.server.requests_seen.append((self.command, path, urllib.parse.parse_qs(url.query)))
        status, body = ANSWERS.get((self.command, path), (404, b'{"message": "No such thing"}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = answer


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DockerApi, Daemon]]:
    socket_path = tmp_path / "docker.sock"
    server = Daemon(str(socket_path), Handler)
    server.requests_seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield DockerApi(f"unix://{socket_path}", timeout=5), server
    server.shutdown()
    server.server_close()


def test_answers_become_values_and_a_missing_thing_none(daemon: tuple[DockerApi, Daemon]) -> None:
    docker, _ = daemon
    docker.ping()
    assert docker.image("registry:5000/team/builder:12.8") == {"Id": "sha256:ab"}
    assert docker.image("absent:1") is None
    assert docker.container("absent") is None
    found = docker.container("fdl-warm-1")
    assert found is not None and container_name(found) == "fdl-warm-1"
    assert labels_of(found) == {"fdl-tasks.warm": "/srv"}
    [listed] = docker.containers(["fdl-tasks.warm=/srv", "fdl-tasks.job=a b"])
    assert container_name(listed) == "fdl-warm-2" and labels_of(listed) == {"k": "v"}
    docker.remove_container("fdl-warm-2")
    docker.remove_container("gone")  # already gone: no error


def test_a_refusal_keeps_the_daemons_status_and_message(daemon: tuple[DockerApi, Daemon]) -> None:
    docker, _ = daemon
    with pytest.raises(DockerRefused) as refused:
        docker.image("Upper:1")
    assert refused.value.status == 400
    assert str(refused.value) == "400 Bad Request: invalid reference format"
    with pytest.raises(
        DockerRefused, match="500 Internal Server Error: driver failed: device busy"
    ):
        docker.remove_container("busy")


def test_requests_carry_the_filters_and_force(daemon: tuple[DockerApi, Daemon]) -> None:
    docker, server = daemon
    docker.containers(["fdl-tasks.warm=/srv", "fdl-tasks.job=a b"])
    docker.remove_container("fdl-warm-2")
    (_, _, listing), (method, path, removal) = server.requests_seen
    assert listing["all"] == ["1"]
    assert json.loads(listing["filters"][0]) == {
        "label": ["fdl-tasks.warm=/srv", "fdl-tasks.job=a b"]
    }
    assert (method, path, removal) == ("DELETE", "/containers/fdl-warm-2", {"force": ["1"]})


@pytest.mark.parametrize(
    "host",
    ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:1", "ssh://build@box", "npipe:////./pipe"],
)
def test_no_daemon_is_unreachable_and_says_where(host: str) -> None:
    with pytest.raises(DockerUnreachable, match=host.split("//")[0]):
        DockerApi(host, timeout=2).ping()


def test_docker_host_decides_where_and_the_default_is_the_usual_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert DockerApi().host == "unix:///var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert DockerApi().host == "unix:///run/user/1000/docker.sock"


def test_tls_without_its_certificates_is_unreachable_naming_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    with pytest.raises(DockerUnreachable, match=r"DOCKER_HOST=tcp://127\.0\.0\.1:2376"):
        DockerApi("tcp://127.0.0.1:2376", timeout=2).ping()
