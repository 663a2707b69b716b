"""The Docker Engine API, asked over the daemon's socket with the standard library.

Why not the Docker SDK: the few questions asked here (is the daemon there, an
image's id and entrypoint, a container's state, the containers or networks
carrying a label, a removal) are single HTTP requests, while importing the SDK
(``requests``, ``urllib3``, its models) costs about 0.1 s of CPU in every
``inv``, taken from the builds and logins running beside it on a small machine.

The daemon is the one the ``docker`` client reaches without a context:
``DOCKER_HOST`` (``unix://``, or ``tcp://`` with TLS under ``DOCKER_TLS_VERIFY``
and the certificates in ``DOCKER_CERT_PATH``, else ``~/.docker``), by default
``/var/run/docker.sock``. Unversioned paths get the daemon's own API version.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

#: Where the daemon listens when ``DOCKER_HOST`` is not set.
DEFAULT_SOCKET = "/var/run/docker.sock"


class DockerError(Exception):
    """The daemon could not be asked, or refused."""


class DockerUnreachable(DockerError):
    """No answer: no daemon at the address, a refused connection, a timeout."""


class DockerRefused(DockerError):
    """The daemon answered with an error status; its own message is kept."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {http.client.responses.get(status, 'Error')}: {message}")
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(host: str, timeout: float) -> http.client.HTTPConnection:
    """A connection to the daemon at ``host`` (``DOCKER_HOST``'s syntax)."""
    parts = urllib.parse.urlsplit(host)
    if parts.scheme == "unix":
        return _UnixConnection(parts.path or DEFAULT_SOCKET, timeout)
    if parts.scheme == "tcp" and parts.hostname:
        if not os.environ.get("DOCKER_TLS_VERIFY"):
            return http.client.HTTPConnection(parts.hostname, parts.port or 2375, timeout=timeout)
        import ssl  # only for a TLS daemon

        certs = os.environ.get("DOCKER_CERT_PATH") or os.path.expanduser("~/.docker")
        context = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        context.load_cert_chain(os.path.join(certs, "cert.pem"), os.path.join(certs, "key.pem"))
        port = parts.port or 2376
        return http.client.HTTPSConnection(parts.hostname, port, timeout=timeout, context=context)
    raise DockerUnreachable(f"DOCKER_HOST={host}: only unix:// and tcp:// daemons are asked")


class DockerApi:
    """Requests to one daemon, each on a connection of its own (a socket's connect costs
    microseconds, and build threads ask at once)."""

    def __init__(self, host: str | None = None, timeout: float = 10) -> None:
        self.host = host or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
        self.timeout = timeout

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON answer (``None`` for an empty one); :class:`DockerRefused` on an
        error status, :class:`DockerUnreachable` when no daemon answers."""
        url = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        try:
            connection = _connection(self.host, self.timeout)
        except (OSError, ValueError) as exc:  # a certificate that cannot be read
            raise DockerUnreachable(f"DOCKER_HOST={self.host}: {exc}") from None
        try:
            connection.request(method, url)
            answer = connection.getresponse()
            body = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            raise DockerUnreachable(f"{self.host}: {exc or type(exc).__name__}") from None
        finally:
            connection.close()
        try:
            data = json.loads(body) if body.strip() else None
        except ValueError:
            data = body.decode(errors="replace").strip()
        if answer.status >= 400:
            message = data.get("message") if isinstance(data, dict) else data
            raise DockerRefused(answer.status, str(message or answer.reason))
        return data

    def ping(self) -> None:
        self.request("GET", "/_ping")

    def image(self, name: str) -> dict[str, Any] | None:
        """An image's inspection (``Id``, ``Config``), ``None`` when there is no such image."""
        return self._inspect("images", name)

    def container(self, name: str) -> dict[str, Any] | None:
        """A container's inspection (``State.Status``, ``Config.Labels``), ``None``: none."""
        return self._inspect("containers", name)

    def containers(self, labels: Iterable[str]) -> list[dict[str, Any]]:
        """Every container, running or not, carrying all ``labels`` (``key`` or ``key=value``):
        ``Id``, ``Names``, ``Labels``."""
        query = {"all": "1", "filters": json.dumps({"label": list(labels)})}
        return list(self.request("GET", "/containers/json", query) or [])

    def networks(self, labels: Iterable[str]) -> list[dict[str, Any]]:
        """Every network carrying all ``labels``: ``Name``, ``Labels``."""
        query = {"filters": json.dumps({"label": list(labels)})}
        return list(self.request("GET", "/networks", query) or [])

    def remove_container(self, name: str) -> None:
        """``docker rm -f``: removed, running or not; one already gone is no error."""
        try:
            self.request("DELETE", f"/containers/{_quoted(name)}", {"force": "1"})
        except DockerRefused as exc:
            if exc.status != 404:
                raise

    def _inspect(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            found = self.request("GET", f"/{kind}/{_quoted(name)}/json")
        except DockerRefused as exc:
            if exc.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None


def _quoted(name: str) -> str:
    """A name in a path: a reference keeps its ``/`` and ``:`` (the daemon routes them)."""
    return urllib.parse.quote(name, safe="/:@")


def container_name(found: Mapping[str, Any]) -> str:
    """A container's name, from an inspection (``Name``) or a listing (``Names``)."""
    names = found.get("Names") or [found.get("Name") or found.get("Id", "")[:12]]
    return str(names[0]).lstrip("/")


def labels_of(found: Mapping[str, Any]) -> dict[str, str]:
    """A listed container's or network's labels (an inspected container's are in its config)."""
    labels = found.get("Labels") or (found.get("Config") or {}).get("Labels") or {}
    return dict(labels)
