"""Every path under ``target/cluster/``: the one place that decides the target-dir layout.

Pure logic. The tree, relative to the project root::

    target/cluster/
      _shared/<arch-slug>[-<cpu>]-<key>/   one cargo target dir per build environment
      <host>/<arch-slug>[-<cpu>]/          the host's own binaries (``--per-host``: its build)
      _envelopes/<command>.json            the published envelope of each command
      _envelopes/<command>.sources.json    its sidecar: the tree each host's binary was built from
      _watch/                              ``prebuild --watch`` state
      _warm/<job>                          the warm build container each job used last
      _timings/<command>-<started>.html    ``--timings`` pages, the last few per command
      _prebuild.lock                       one prebuild (or clean) per project at a time

A shared target dir is keyed by what changes the compiled output of every
binary and that cargo's fingerprint cannot see (:class:`BuildKey`), never by
the command or the crate: cargo keeps every binary and package of a
workspace in one target dir and locks it, so a second command compiles only
what it adds. Host labels cannot start with ``_``, so no host directory can
collide with the tool's own entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import attrs

from fdl_tasks.config.model import Arch

#: Where every build tree lives, relative to the project root.
CLUSTER_TARGET = "target/cluster"
#: cargo builds release binaries into this subdirectory of a target dir.
PROFILE_DIR = "release"
#: Shared build trees, one per build environment.
SHARED_DIR = f"{CLUSTER_TARGET}/_shared"
#: Published envelopes, one file per command.
ENVELOPES_DIR = f"{CLUSTER_TARGET}/_envelopes"
#: ``prebuild --watch`` keeps its state here.
WATCH_DIR = f"{CLUSTER_TARGET}/_watch"
#: Which warm build container each job used last, and when (its file's time).
WARM_DIR = f"{CLUSTER_TARGET}/_warm"
#: ``--timings`` pages, one per run (or watch cycle).
TIMINGS_DIR = f"{CLUSTER_TARGET}/_timings"
#: Where cargo's own ``--timings`` writes its reports, inside a target dir.
CARGO_TIMINGS_DIR = "cargo-timings"
#: Held while a prebuild (or a clean) works on the tree.
LOCK_FILE = f"{CLUSTER_TARGET}/_prebuild.lock"
#: In each target dir: the identity of the build environment it holds.
MARKER_FILE = ".fdl-build.json"
#: Entries of ``target/cluster/`` that are the tool's own, not target dirs.
OWN_ENTRIES = frozenset(
    p.rsplit("/", 1)[1] for p in (ENVELOPES_DIR, WATCH_DIR, WARM_DIR, TIMINGS_DIR, LOCK_FILE)
)


@attrs.frozen(kw_only=True)
class BuildKey:
    """What a target dir's contents depend on beyond what cargo can see.

    ``mode`` (``native``, ``docker``, ``compose``) and ``environment`` (the
    image, or the compose service) decide the toolchain and system headers;
    ``arch`` the libtorch variant, mounted at one fixed container path;
    ``features`` the cargo features; ``cpu_arch``, ``rust_target`` and
    ``linker`` a cross build. Each field is named in the digest, so adding a
    field never silently changes what an existing one means.
    """

    mode: str
    arch: Arch
    features: tuple[str, ...]
    environment: str = ""
    cpu_arch: str | None = None
    rust_target: str | None = None
    linker: str | None = None

    def identity(self) -> dict[str, object]:
        """The fields by name, as the marker file records them."""
        return {
            "mode": self.mode,
            "arch": self.arch,
            "features": list(self.features),
            "environment": self.environment,
            "cpu_arch": self.cpu_arch,
            "rust_target": self.rust_target,
            "linker": self.linker,
        }

    def marker(self) -> str:
        """The marker file's text: the identity, one canonical JSON line."""
        return json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.marker().encode()).hexdigest()[:10]


def arch_slug(arch: Arch) -> str:
    """``precompiled/cu128`` → ``precompiled-cu128``: one path segment per arch."""
    return arch.replace("/", "-")


def build_slug(arch: Arch, cpu_arch: str | None = None) -> str:
    """The arch's slug, with the CPU architecture appended for a cross build."""
    return f"{arch_slug(arch)}-{cpu_arch}" if cpu_arch else arch_slug(arch)


def shared_dir(key: BuildKey) -> str:
    """``target/cluster/_shared/<slug>-<key digest>``: every command of one environment."""
    return f"{SHARED_DIR}/{build_slug(key.arch, key.cpu_arch)}-{key.digest}"


def host_dir(host: str, arch: Arch, cpu_arch: str | None = None) -> str:
    """``target/cluster/<host>/<arch-slug>[-<cpu>]``: keyed by host, arch and CPU.

    Docker mounts every variant at the same container path, so cargo's own
    fingerprint cannot see an arch swap; a new arch must mean a new directory.
    """
    return f"{CLUSTER_TARGET}/{host}/{build_slug(arch, cpu_arch)}"


def host_binary(host: str, arch: Arch, command: str, cpu_arch: str | None = None) -> str:
    """The binary relative to the project root (and to every worker's ``path``)."""
    return f"{host_dir(host, arch, cpu_arch)}/{PROFILE_DIR}/{command}"


def built_binary(target_dir: str, command: str, rust_target: str | None = None) -> str:
    """Where cargo leaves ``command`` in ``target_dir`` (under the triple when cross-building)."""
    triple = f"{rust_target}/" if rust_target else ""
    return f"{target_dir}/{triple}{PROFILE_DIR}/{command}"


def log_file(target_dir: str, command: str) -> str:
    """One build log per command in a target dir (several commands share one)."""
    return f"{target_dir}/build-{command}.log"


def timings_page(command: str, started: str) -> str:
    """One run's ``--timings`` page; ``started`` (UTC, sortable) orders the kept pages."""
    return f"{TIMINGS_DIR}/{command}-{started}.html"


def envelope_file(command: str) -> str:
    """The published envelope of ``command``: launching one never reads another's."""
    return f"{ENVELOPES_DIR}/{command}.json"


def sources_file(command: str) -> str:
    """The envelope's sidecar: the tree each host's binary of ``command`` was built from
    (a command has no ``.``: never another command's envelope)."""
    return f"{ENVELOPES_DIR}/{command}.sources.json"


def stale_dirs(existing: Iterable[str], live: Iterable[str]) -> list[str]:
    """Entries of the tree (``_shared/x``, ``host``, ``host/slug``) that no live dir needs.

    ``existing`` lists, relative to ``target/cluster``, every top-level entry and
    every directory one level below it; the tool's own entries are never stale.
    A host directory is stale as a whole when nothing live is under it.
    """
    prefix = f"{CLUSTER_TARGET}/"
    wanted = {path.removeprefix(prefix) for path in live}
    wanted_tops = {path.split("/", 1)[0] for path in wanted}
    stale = []
    for entry in sorted(existing):
        top, _, rest = entry.partition("/")
        if top in OWN_ENTRIES:
            continue
        if top not in wanted_tops:
            if not rest:
                stale.append(entry)
        elif rest and entry not in wanted:
            stale.append(entry)
    return stale
