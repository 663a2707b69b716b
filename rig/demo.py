"""The embedded demo rig that ``fdl.cluster.yml`` (and ``cluster.yaml``) at the root describe.

``python3 -m rig.demo up`` makes a flodl-shaped project tree (the fixture
workspace, four x86_64 stub libtorch variants and an aarch64 one, and a
``docker-compose.yml`` with flodl's ``dev`` and ``cuda`` services plus a
``cuda-arm64`` cross-build service) and starts five simulated workers, each a
real sshd on its own loopback address; ``node-gh200`` is an aarch64 host
whose programs run under qemu-user (:mod:`rig.cross`). ``down`` stops them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rig.cross import add_aarch64_variant, ensure
from rig.harness import bring_up
from rig.project import write_compose_file
from rig.sshrig import HostSpec, Rig

DEMO = Path("/var/tmp/fdl-demo")
PROJECT = DEMO / "project"
RIG = Rig(DEMO / "rig")
HOSTS = (
    HostSpec("node-blackwell", "127.0.0.2"),
    HostSpec("node-blackwell-2", "127.0.0.5"),
    HostSpec("node-pascal", "127.0.0.3"),
    HostSpec("node-cpu", "127.0.0.4"),
    HostSpec("node-gh200", "127.0.0.6", emulate="aarch64"),
)
VARIANTS = ("precompiled/cu128", "builds/sm61-sm120", "precompiled/cpu", "precompiled/cu126")
#: Compiled for aarch64: node-gh200's libtorch, a directory of its own on the share.
AARCH64_VARIANTS = ("precompiled/cu128-aarch64",)


def up() -> None:
    ensure()  # qemu binfmt for node-gh200, the cross image for its stub and builds
    bring_up(RIG, HOSTS, PROJECT, VARIANTS, known_hosts=DEMO / "known_hosts")
    for arch in AARCH64_VARIANTS:
        add_aarch64_variant(PROJECT, arch)
    write_compose_file(PROJECT, cross=True)
    (PROJECT / "data").mkdir(exist_ok=True)
    pascal_view = DEMO / "mnt" / "pascal"
    pascal_view.parent.mkdir(parents=True, exist_ok=True)
    if not pascal_view.is_symlink():
        os.symlink(PROJECT, pascal_view)
    print(f"demo rig up: {len(HOSTS)} workers, project at {PROJECT}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rig.demo")
    parser.add_argument("action", choices=["up", "down"])
    if parser.parse_args().action == "up":
        up()
    else:
        RIG.down()
        print("demo rig down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
