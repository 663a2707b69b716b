"""Which controller settings fit its build mode: checked by the loader, before any backend.

A cross setup's ``image`` fits only ``docker run`` builds and its ``service``
only compose builds; a ``controller.gpu_builds`` entry must name what the mode
builds with (``toolchain_key``), and native builds take none. Pure.
"""

from __future__ import annotations

from fdl_tasks.config.model import ComposeService, Controller, DockerSettings

#: What each kind of ``controller.docker`` builds with (``""``: native cargo), and whether
#: the project is bind-mounted by ``docker run`` (its path cannot hold ``:`` or ``,``).
TOOLCHAIN_KEYS: dict[type[object], tuple[str, bool]] = {
    type(None): ("", False),
    DockerSettings: ("image", True),
    ComposeService: ("service", False),
}

_ONLY = {
    "image": "only for a 'docker run' builder (controller.docker as a mapping)",
    "service": "only for compose builds (controller.docker naming a compose service)",
}
_NAMED = {"image": "a docker run image", "service": "a compose service"}


def misfits(controller: Controller) -> list[str]:
    """Every ``<key>: <problem>`` of settings that the controller's build mode cannot use."""
    toolchain_key, bind_mounted = TOOLCHAIN_KEYS[type(controller.docker)]
    problems = []
    path = controller.path
    if bind_mounted and (":" in path or "," in path):
        problems.append(
            f"controller.path: {path!r} cannot be bind-mounted by Docker (it contains "
            "':' or ','); move the project or build with native cargo"
        )
    for machine, setup in controller.cross.items():
        given = {"image": setup.image, "service": setup.service}
        for key, value in given.items():
            if value and key != toolchain_key:
                problems.append(f"controller.cross[{machine!r}].{key}: {_ONLY[key]}")
    for vendor, build in controller.gpu_builds.items():
        where = f"controller.gpu_builds.{vendor}"
        if not toolchain_key:
            problems.append(f"{where}: native builds use this machine's cargo for every vendor")
        elif not getattr(build, toolchain_key):
            article = "an" if toolchain_key == "image" else "a"
            problems.append(
                f"{where} needs {article} '{toolchain_key}:' (controller.docker is "
                f"{_NAMED[toolchain_key]})"
            )
    return problems
