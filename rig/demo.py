"""The embedded demo rig that ``fdl.cluster.yml`` (and ``cluster.yaml``) at the root describe.

``python3 -m rig.demo up`` makes a flodl-shaped project tree (the fixture
workspace, four x86_64 stub libtorch variants and an aarch64 one, and a
``docker-compose.yml`` with flodl's ``dev`` and ``cuda`` services plus a
``cuda-arm64`` cross-build service) and starts five simulated workers, each a
real sshd on its own loopback address; ``node-gh200`` is an aarch64 host
whose programs run under qemu-user (:mod:`rig.cross`). ``down`` stops them.
A re-run keeps the user's edits to the demo's crate (and says which), so that
``scripts/demo --keep`` twice loses no work.

``--state DIR --first-address ADDR`` brings the same rig up with its sshd
state elsewhere and its hosts at other addresses (the README's quick-start
test, in a mount namespace of its own): the client key is then copied to the
path the cluster files name, so that only the addresses differ.
``--no-aarch64`` leaves out node-gh200 and its variant, whose stub is compiled
in a container (which would not see such a namespace's files).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.build.warm_containers_io import remove_project_containers
from rig.cross import add_aarch64_variant, ensure
from rig.harness import bring_up
from rig.project import FIXTURE_DIR, write_compose_file
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


def hosts_from(first: str | None) -> tuple[HostSpec, ...]:
    """The demo's hosts, in :data:`HOSTS` order at ``first``, ``first`` + 1, … (None: as is)."""
    if first is None:
        return HOSTS
    base = ipaddress.IPv4Address(first)
    return tuple(dataclasses.replace(spec, address=str(base + n)) for n, spec in enumerate(HOSTS))


def user_edits(project: Path, fixture: Path = FIXTURE_DIR) -> dict[Path, bytes]:
    """The files of the demo's crate that differ from the fixture the demo laid out: a
    user's edits, which laying the fixture out again would overwrite."""
    edits = {}
    for source in sorted(fixture.rglob("*")):
        target = project / source.relative_to(fixture)
        if source.is_file() and target.is_file() and target.read_bytes() != source.read_bytes():
            edits[target] = target.read_bytes()
    return edits


def keep_edits(edits: dict[Path, bytes], project: Path) -> None:
    """Write ``edits`` back over the fixture's files, and say so."""
    for path, content in edits.items():
        path.write_bytes(content)
    if edits:
        names = ", ".join(str(path.relative_to(project)) for path in edits)
        print(
            f"demo: kept your edits to {names} in {project} (delete a file to get the "
            "demo's own back)"
        )


def up(rig: Rig = RIG, hosts: Sequence[HostSpec] = HOSTS) -> None:
    aarch64 = any(spec.emulate == "aarch64" for spec in hosts)
    if aarch64:
        ensure()  # qemu binfmt for node-gh200, the cross image for its stub and builds
    edits = user_edits(PROJECT)
    bring_up(rig, hosts, PROJECT, VARIANTS, known_hosts=DEMO / "known_hosts")
    keep_edits(edits, PROJECT)
    if rig.client_key != RIG.client_key:  # the key where the cluster files say it is
        RIG.client_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(rig.client_key, RIG.client_key)
        os.chmod(RIG.client_key, 0o600)
    for arch in AARCH64_VARIANTS if aarch64 else ():
        add_aarch64_variant(PROJECT, arch)
    write_compose_file(PROJECT, cross=True)
    (PROJECT / "data").mkdir(exist_ok=True)
    pascal_view = DEMO / "mnt" / "pascal"
    pascal_view.parent.mkdir(parents=True, exist_ok=True)
    if not pascal_view.is_symlink():
        os.symlink(PROJECT, pascal_view)
    where = ", ".join(f"{spec.name} {spec.address}" for spec in hosts)
    print(f"demo rig up: {len(hosts)} workers ({where}), project at {PROJECT}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rig.demo")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state", type=Path, help="the sshd state dir (default: the demo's)")
    parser.add_argument("--first-address", help="the first host's address; the others follow")
    parser.add_argument("--no-aarch64", action="store_true", help="leave out node-gh200")
    args = parser.parse_args(argv)
    rig = Rig(args.state) if args.state else RIG
    if args.action == "up":
        hosts = hosts_from(args.first_address)
        up(rig, [spec for spec in hosts if not (args.no_aarch64 and spec.emulate)])
    else:
        rig.down()
        for line in remove_project_containers(str(PROJECT)):  # its warm build containers
            print(f"demo: {line}")
        print("demo rig down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
