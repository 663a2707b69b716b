"""Which launcher runs a job, and what it needs from the project. Pure.

flodl's launcher (``fdl @<env> CMD``) reads the cluster from the flodl
project's ``fdl.yml`` layers, so it is the default exactly when this tool read
the cluster from them too; the direct mode serves programs that are not flodl
launchers. When the launcher runs in a compose service (the controller's
``docker:``), that service must pass the envelope's variable into the
container, as flodl's own ``docker-compose.yml`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fdl_tasks.config.model import FlodlOrigin
from fdl_tasks.core.errors import FdlError

#: The variable flodl's launcher reads the envelope map from (prebuild writes it).
ENV_PREBUILD_PER_HOST = "FLODL_INTERNAL_PREBUILD_PER_HOST"

Mode = Literal["fdl", "direct"]
#: flodl's command-line tool, whose ``@<env>`` form runs the launcher.
FDL = "fdl"
#: What the direct mode says once: what a flodl DDP run would miss.
DIRECT_NOTE = (
    "direct mode: each worker runs its binary on its own; no world is formed (no join "
    "window, no ranks, no process group): a flodl DDP run needs --launcher fdl"
)


def launch_mode(chosen: str, origin: FlodlOrigin | None, source: str) -> Mode:
    """``fdl.launcher`` / ``--launcher`` resolved: ``auto`` is flodl's launcher on a flodl
    project (the cluster read from its ``fdl.yml`` layers), else direct."""
    flodl_project = origin is not None and origin.root is not None
    if chosen == "auto":
        return "fdl" if flodl_project else "direct"
    if chosen == "fdl" and not flodl_project:
        raise FdlError(
            f"--launcher fdl runs flodl's launcher, which reads the cluster from a flodl "
            f"project's fdl.yml and its overlay, and {source} is not read from one: run "
            "from the flodl project, or use --launcher direct"
        )
    return "fdl" if chosen == "fdl" else "direct"


def fdl_argv(env: str | None, command: str, args: Sequence[str]) -> list[str]:
    """``fdl @<env> CMD --no-prebuild ARGS``: the builds are this tool's, already verified."""
    return [FDL, *([f"@{env}"] if env else []), command, "--no-prebuild", *args]


#: Where ``docker compose`` looks for the project's file, in its own order.
COMPOSE_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")


def forwards(compose: object, service: str, variable: str = ENV_PREBUILD_PER_HOST) -> bool:
    """Whether ``service`` of a compose file's data passes ``variable`` into its container:
    an ``environment:`` entry for it, in the list form (``- NAME``, ``- NAME=…``) or the
    mapping form."""
    services = compose.get("services") if isinstance(compose, Mapping) else None
    entry = services.get(service) if isinstance(services, Mapping) else None
    environment: Any = entry.get("environment") if isinstance(entry, Mapping) else None
    if isinstance(environment, Mapping):
        return variable in environment
    if isinstance(environment, list):
        return any(str(item).split("=", 1)[0] == variable for item in environment)
    return False


def forwarding_warning(compose_file: str, service: str) -> str:
    return (
        f"compose service {service!r} ({compose_file}) does not forward "
        f"{ENV_PREBUILD_PER_HOST}: flodl's launcher in that container would not see the "
        f"envelope, and every host would fall back to 'fdl <cmd>': add it to the service's "
        f"environment: (a bare '- {ENV_PREBUILD_PER_HOST}'), as flodl's own "
        "docker-compose.yml does"
    )
