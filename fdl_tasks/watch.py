"""``prebuild --watch``: every host's binary rebuilt as the user saves.

One full prebuild first (preflight, builds, verification, publication), then
a cycle whenever a file the build depends on changes:

- what counts (:meth:`Scope.classify`): ``*.rs``, ``Cargo.toml``, ``Cargo.lock``,
  ``.cargo/config*`` and ``rust-toolchain*`` anywhere in the workspace (path
  dependencies live beside the crate); what a build script declares with
  ``cargo:rerun-if-changed`` (read from ``release/build/*/output`` in the
  cycle's target dirs, container paths mapped back to the controller), or its
  whole package when it declares nothing, as cargo does; each variant's
  ``libtorch/<arch>``; the cluster file (re-read, then preflight again). Never
  ``target/``, VCS or tool caches, editor swap files, or what the tool writes;
- when (:class:`Debouncer`): a burst of saves is one cycle once the tree is
  quiet for ``fdl.watch_debounce`` seconds; saves during a cycle queue exactly
  one more after it; a cycle in progress is never cut short;
- how: ``watchfiles`` (inotify), or its polling where inotify cannot see other
  hosts' writes (the project root on NFS, SMB, 9p, virtiofs, a FUSE mount such
  as sshfs or an S3 bucket; detected from ``/proc/self/mountinfo``) or when
  ``fdl.watch_polling`` says so.

Each cycle is :func:`fdl_tasks.pipeline.prebuild`, so every guarantee holds:
a failed cycle has withdrawn the envelope and prints every host's diagnostics
together, and watching goes on; Ctrl-C or SIGTERM ends the watcher with the
last good envelope or none, and no build container.

``inv launch`` asks :func:`wait_for_watch` first: while a cycle is pending or
building (state in ``target/cluster/_watch/<command>.json``, the watcher's
liveness from a lock it holds), or a watched file is newer than the last
cycle's start, it waits, boundedly, for the new envelope.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import posixpath
import socket
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import watchfiles

from fdl_tasks import pipeline
from fdl_tasks.envelope import ENV_PREBUILD_PER_HOST, published_path
from fdl_tasks.errors import FdlError, Stopped
from fdl_tasks.files import write_atomically
from fdl_tasks.interrupts import sigterm_as_interrupt
from fdl_tasks.layout import PROFILE_DIR, WATCH_DIR
from fdl_tasks.loader import load_cluster
from fdl_tasks.model import ComposeService, DockerSettings
from fdl_tasks.plan import BuildSpec
from fdl_tasks.rules import libtorch_dir
from fdl_tasks.run import Report, Run

#: Directory names never watched anywhere in the workspace (hidden ones neither,
#: except ``.cargo``): version control and tool caches.
IGNORED_DIRS = frozenset(
    {".git", ".hg", ".svn", ".jj", "__pycache__", "node_modules", ".venv", ".mypy_cache"}
)
MANIFESTS = frozenset({"Cargo.toml", "Cargo.lock"})
TOOLCHAIN_FILES = frozenset({"rust-toolchain", "rust-toolchain.toml"})
CARGO_CONFIGS = frozenset({"config", "config.toml"})
RERUN_PREFIXES = ("cargo:rerun-if-changed=", "cargo::rerun-if-changed=")
#: Filesystems whose changes made on another host inotify never reports.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "virtiofs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "afs",
        "ocfs2",
        "gfs2",
        "davfs",
        "fuse",
    }
)
#: FUSE filesystems that only show this machine's own files (every other
#: ``fuse.*`` is taken for a network mount: sshfs, s3fs, mountpoint-s3, rclone, …).
LOCAL_FUSE = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs", "fuse.bindfs", "fuse.portal"})
#: watchfiles: a batch ends after this many ms without events, at the latest after _GROUP_MS.
_STEP_MS = 50
_GROUP_MS = 400
#: Polling: how often the tree is walked (ms).
POLL_MS = 500
#: A burst of changes never delays a cycle longer than this many debounce periods.
_LONGEST_FACTOR = 10
#: Files of a directory that appears at once (moved in) examined at most.
_NEW_DIR_FILES = 5000
#: Launch: how long a change newer than the last cycle may stay unseen by the watcher.
UNSEEN_GRACE = 10.0
_LAUNCH_POLL = 0.2


class Kind(enum.Enum):
    """Why a changed path matters."""

    SOURCE = "source"
    MANIFEST = "manifest"
    BUILD_CONFIG = "build config"
    DECLARED = "build script input"
    LIBTORCH = "libtorch"
    CLUSTER = "cluster file"


# ---------------------------------------------------------------------------- what counts


def under(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or inside it (plain path text, no file system access)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _ignored_dir(name: str) -> bool:
    return name in IGNORED_DIRS or (name.startswith(".") and name != ".cargo")


def _scratch_file(name: str) -> bool:
    """Editor swap, backup and lock files (``.#main.rs``, ``main.rs~``, ``4913``, …)."""
    return (
        name.startswith(".")
        or name.endswith(("~", ".swp", ".swo", ".swx", ".tmp", ".log"))
        or "___jb_" in name
        or name == "4913"
    )


@attrs.frozen
class Scope:
    """What a watcher watches, as plain absolute paths; pure, and JSON-able for launch."""

    root: str
    cluster_file: str
    #: ``<root>/libtorch/<arch>`` of every build.
    variants: tuple[str, ...] = ()
    #: Target dirs and the tool's own files: never a change.
    excluded: tuple[str, ...] = ()
    #: ``rerun-if-changed`` files and directories.
    declared: tuple[str, ...] = ()
    #: Packages whose build script declares nothing: any file of theirs counts.
    packages: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return posixpath.join(self.root, "target")

    def classify(self, path: str) -> Kind | None:
        """Why a change of ``path`` needs a cycle, or ``None`` when it does not."""
        path = posixpath.normpath(path)
        if path == self.cluster_file:
            return Kind.CLUSTER
        if under(path, self.target) or any(under(path, d) for d in self.excluded):
            return None
        if any(under(path, v) for v in self.variants):
            return Kind.LIBTORCH
        if path in self.declared:  # named by a build script: whatever its name
            return Kind.DECLARED
        inside = under(path, self.root)
        if inside and path != self.root:
            parents = posixpath.relpath(path, self.root).split("/")[:-1]
            if any(_ignored_dir(part) for part in parents):
                return None
        name = posixpath.basename(path)
        if _scratch_file(name):
            return None
        if any(under(path, d) for d in self.declared):
            return Kind.DECLARED
        if not inside:
            return None
        if name in MANIFESTS:
            return Kind.MANIFEST
        if name.endswith(".rs"):
            return Kind.SOURCE
        if name in TOOLCHAIN_FILES or (
            name in CARGO_CONFIGS and posixpath.basename(posixpath.dirname(path)) == ".cargo"
        ):
            return Kind.BUILD_CONFIG
        if any(under(path, d) for d in self.packages):
            return Kind.DECLARED
        return None

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scope:
        def strings(key: str) -> tuple[str, ...]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(key)
            return tuple(value)

        root, cluster = data.get("root"), data.get("cluster_file")
        if not isinstance(root, str) or not isinstance(cluster, str):
            raise ValueError("root")
        return cls(
            root,
            cluster,
            strings("variants"),
            strings("excluded"),
            strings("declared"),
            strings("packages"),
        )


def gone_directory(scope: Scope, path: str) -> Kind | None:
    """A removed path without a suffix may have been a directory of sources (moved away
    whole, it sends no event per file): it counts when a source inside it would."""
    if "." in posixpath.basename(path.rstrip("/")):
        return None
    return Kind.SOURCE if scope.classify(posixpath.join(path, "lib.rs")) else None


def rerun_declarations(output: str) -> list[str]:
    """The paths a build script's ``output`` file declares with ``rerun-if-changed``."""
    found = []
    for line in output.splitlines():
        for prefix in RERUN_PREFIXES:
            if line.startswith(prefix) and line[len(prefix) :].strip():
                found.append(line[len(prefix) :].strip())
    return found


def host_path(path: str, mounts: Sequence[tuple[str, str | None]]) -> str | None:
    """A path a build saw inside its container, in the controller's view.

    ``mounts``: (container path, controller path, or ``None`` for a mount that is
    watched otherwise, such as the libtorch variant). Other paths are returned as
    they are: a native build's, or a container's own (the caller drops those
    that do not exist here).
    """
    for inside, outside in mounts:
        if under(path, inside):
            if outside is None:
                return None
            return posixpath.normpath(outside + "/" + path[len(inside) :].lstrip("/"))
    return posixpath.normpath(path)


def declared_inputs(
    outputs: Iterable[tuple[str, str]],
    packages: Mapping[str, Sequence[str]],
    mounts: Sequence[tuple[str, str | None]] = (),
) -> tuple[list[str], list[str]]:
    """(declared paths, package dirs whose build script declares nothing).

    ``outputs``: (package name, text of its build script's ``output`` file);
    ``packages``: package name → its directories in the workspace (a relative
    declaration is relative to the package). Packages not in the workspace
    (registry crates) only contribute their absolute declarations.
    """
    declared: list[str] = []
    whole: list[str] = []
    for name, text in outputs:
        paths = rerun_declarations(text)
        dirs = packages.get(name, ())
        if not paths:
            whole += dirs
            continue
        for raw in paths:
            if raw.startswith("/"):
                mapped = host_path(raw, mounts)
                if mapped is not None:
                    declared.append(mapped)
            else:
                declared += [posixpath.normpath(posixpath.join(d, raw)) for d in dirs]
    return sorted(set(declared)), sorted(set(whole))


def make_scope(
    root: str,
    cluster_file: str,
    variants: Iterable[str],
    package_dirs: Iterable[str] = (),
    declared: Iterable[str] = (),
    whole_packages: Iterable[str] = (),
    own: Iterable[str] = (),
) -> Scope:
    """A scope: every package's ``target/`` excluded, declarations under a target dropped."""
    root = posixpath.normpath(root)
    excluded = {posixpath.join(root, "target")}
    excluded |= {posixpath.join(posixpath.normpath(d), "target") for d in package_dirs}
    excluded |= {posixpath.normpath(p) for p in own}
    kept = sorted(
        {p for p in declared if not any(under(p, e) for e in excluded)} - {posixpath.normpath(root)}
    )
    return Scope(
        root,
        posixpath.normpath(cluster_file),
        tuple(sorted({posixpath.normpath(v) for v in variants})),
        tuple(sorted(excluded)),
        tuple(kept),
        tuple(sorted(set(whole_packages))),
    )


# ---------------------------------------------------------------------------- where to watch


@attrs.frozen
class WatchPlan:
    """Directories watched with their whole tree, and directories watched alone."""

    recursive: tuple[str, ...]
    flat: tuple[str, ...]


def nearest_existing(path: str, stop: str, exists: Callable[[str], bool]) -> str:
    """``path`` or its closest existing ancestor, never above ``stop``."""
    while not exists(path) and path != stop and path not in ("/", ""):
        path = posixpath.dirname(path)
    return path


def watch_plan(scope: Scope, top_dirs: Iterable[str], exists: Callable[[str], bool]) -> WatchPlan:
    """What to hand to the watcher so that ``target/`` and unused variants are never walked.

    The root alone (its files, new top-level directories), each top-level
    directory's tree, each variant's ``lib/`` tree and directory alone (or the
    closest ancestor that exists, to see it appear), and the parent directory
    of the cluster file and of each declared input outside the root.
    """
    root = scope.root
    libtorch = posixpath.join(root, "libtorch")
    recursive: set[str] = set()
    flat = {root}
    for name in top_dirs:
        path = posixpath.join(root, name)
        if name == "target" or _ignored_dir(name) or path == libtorch or path in scope.excluded:
            continue
        recursive.add(path)
    for variant in scope.variants:
        lib = posixpath.join(variant, "lib")
        if exists(lib):
            recursive.add(lib)
            flat.add(variant)
        else:
            flat.add(nearest_existing(variant, root, exists))
    for path in (scope.cluster_file, *scope.declared):
        hidden = under(path, root) and any(
            _ignored_dir(part) for part in posixpath.relpath(path, root).split("/")[:-1]
        )
        if hidden or not under(path, root):  # no watched tree holds it
            flat.add(nearest_existing(posixpath.dirname(path), "/", exists))
    flat = {f for f in flat if not any(under(f, r) for r in recursive)}
    return WatchPlan(tuple(sorted(recursive)), tuple(sorted(flat)))


def mount_fstype(mountinfo: str, path: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (a resolved absolute path),
    from ``/proc/self/mountinfo`` text; the last of stacked mounts wins."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        if under(path, point) and (best is None or len(point) >= best[0]):
            best = (len(point), tail[0])
    return best[1] if best else None


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def needs_polling(fstype: str) -> bool:
    """Whether inotify misses changes made by other hosts on this filesystem type."""
    if fstype in NETWORK_FILESYSTEMS:
        return True
    return fstype.startswith("fuse.") and fstype not in LOCAL_FUSE


# ---------------------------------------------------------------------------- when


@attrs.define
class Debouncer:
    """When to start a cycle: pure, with the time passed in.

    Changes collect into one pending batch. It is due once nothing has changed
    for ``quiet`` seconds (or ``longest`` after its first change, so a steady
    trickle cannot starve the build), and never while a cycle builds: what
    changes then becomes exactly one batch, due after it.
    """

    quiet: float
    longest: float
    building: bool = False
    changes: dict[str, Kind] = attrs.field(factory=dict)
    first: float | None = None
    last: float | None = None

    def add(self, changes: Mapping[str, Kind], now: float) -> None:
        if not changes:
            return
        self.changes.update(changes)
        if self.first is None:
            self.first = now
        self.last = now

    def due_at(self) -> float | None:
        """When the pending batch starts (``None``: nothing pending, or a cycle builds)."""
        if self.building or self.first is None or self.last is None:
            return None
        return min(self.last + self.quiet, self.first + self.longest)

    def due(self, now: float) -> bool:
        due = self.due_at()
        return due is not None and now >= due

    def start(self) -> dict[str, Kind]:
        """A cycle starts: it takes the pending batch."""
        if self.building:
            raise RuntimeError("a cycle is already building")
        batch, self.changes = self.changes, {}
        self.first = self.last = None
        self.building = True
        return batch

    def finish(self) -> None:
        """The cycle ended; what changed meanwhile is due once quiet (often at once)."""
        self.building = False

    @property
    def state(self) -> str:
        if self.building:
            return "building"
        return "pending" if self.first is not None else "idle"

    @property
    def queued(self) -> bool:
        """A change arrived while building: one more cycle follows."""
        return self.building and self.first is not None


# ---------------------------------------------------------------------------- what it says


def _shown(path: str, root: str) -> str:
    return posixpath.relpath(path, root) if under(path, root) and path != root else path


def describe_changes(changes: Mapping[str, Kind], root: str, limit: int = 3) -> str:
    """``ddp-bench/src/main.rs changed`` or ``4 files changed (a, b, c, …)``."""
    names = sorted(_shown(p, root) for p in changes)
    if not names:
        return "nothing changed"
    if len(names) == 1:
        return f"{names[0]} changed"
    more = ", …" if len(names) > limit else ""
    return f"{len(names)} files changed ({', '.join(names[:limit])}{more})"


def cycle_line(
    number: int,
    seconds: float,
    what: str,
    rebuilt: Sequence[str],
    fresh: int,
    verified: str,
    probed: bool = False,
) -> str:
    """The one status line of a good cycle: ``rebuilt`` labels, ``fresh`` builds cargo
    found up to date, ``probed`` when preflight ran again."""
    if rebuilt:
        built = f"rebuilt {', '.join(rebuilt)}" + (f" ({fresh} up to date)" if fresh else "")
    else:
        built = f"{fresh} build(s) up to date"
    probe = "preflight ok; " if probed else ""
    return (
        f"watch: cycle {number} ok in {seconds:.1f}s ({what}): {probe}{built}; {verified}; "
        "published"
    )


def build_labels(specs: Iterable[BuildSpec]) -> list[str]:
    """Builds as a reader knows them: by libtorch variant (and CPU of a cross build)."""
    labels = [f"{s.arch} ({s.cpu_arch})" if s.cpu_arch else s.arch for s in specs]
    return [
        f"{label} x{labels.count(label)}" if labels.count(label) > 1 else label
        for label in dict.fromkeys(labels)
    ]


def failed_line(number: int, seconds: float, what: str) -> str:
    return (
        f"watch: cycle {number} FAILED after {seconds:.1f}s ({what}); no envelope is published "
        "until a cycle succeeds; watching for the next change"
    )


def _passes_through(line: str) -> bool:
    """Lines a quiet cycle still shows at once: warnings and waits."""
    lowered = line.lower()
    return "warning" in lowered or "waiting" in lowered


# ---------------------------------------------------------------------------- files


@attrs.frozen
class WatchFiles:
    """The watcher's files under ``target/cluster/_watch/``."""

    root: Path
    command: str

    @property
    def directory(self) -> Path:
        return self.root / WATCH_DIR

    @property
    def state(self) -> Path:
        return self.directory / f"{self.command}.json"

    @property
    def lock(self) -> Path:
        return self.directory / f"{self.command}.lock"

    @property
    def stamp(self) -> Path:
        """Touched when a cycle starts: its mtime is the file system's clock then."""
        return self.directory / f"{self.command}.stamp"


def walk_files(top: str, root: str, limit: int | None = None) -> Iterator[str]:
    """Files under ``top`` as the watcher sees the workspace rooted at ``root``: without
    ``target/`` (the root's, or beside a ``Cargo.toml``), ignored directories, or
    ``<root>/libtorch`` (variants are read on their own)."""
    count = 0
    libtorch = posixpath.join(root, "libtorch")
    for directory, dirs, files in os.walk(top):
        manifest = "Cargo.toml" in files or directory == root
        dirs[:] = [
            d
            for d in dirs
            if not _ignored_dir(d)
            and not (d == "target" and manifest)
            and posixpath.join(directory, d) != libtorch
        ]
        for name in files:
            yield posixpath.join(directory, name)
            count += 1
            if limit is not None and count >= limit:
                return


def scope_files(scope: Scope) -> Iterator[str]:
    """Every file the scope can count, found on disk."""
    yield from walk_files(scope.root, scope.root)
    for variant in scope.variants:
        with contextlib.suppress(OSError):
            yield from (e.path for e in os.scandir(variant) if e.is_file())
        yield from walk_files(posixpath.join(variant, "lib"), scope.root)
    yield scope.cluster_file
    for path in scope.declared:
        yield path  # a hidden one inside the root too (the walk skips those)
        if not under(path, scope.root) and os.path.isdir(path):
            with contextlib.suppress(OSError):
                yield from (e.path for e in os.scandir(path) if e.is_file())


def newest_change(scope: Scope) -> tuple[float, str] | None:
    """The newest mtime among the files the scope counts, and that file."""
    newest: tuple[float, str] | None = None
    for path in scope_files(scope):
        if scope.classify(path) is None:
            continue
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, path)
    return newest


def package_dirs(root: str) -> dict[str, list[str]]:
    """Package name → its directories, from every ``Cargo.toml`` of the workspace."""
    found: dict[str, list[str]] = {}
    for path in walk_files(root, root):
        if posixpath.basename(path) != "Cargo.toml":
            continue
        try:
            with open(path, "rb") as manifest:
                package = tomllib.load(manifest).get("package")
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if isinstance(package, dict) and isinstance(package.get("name"), str):
            found.setdefault(package["name"], []).append(posixpath.dirname(path))
    return found


def build_outputs(
    root: Path, target_dirs: Iterable[tuple[str, str | None]]
) -> list[tuple[str, str]]:
    """(package name, text) of every build script ``output`` in these target dirs.

    ``target_dirs``: (target dir relative to the root, Rust target triple of a cross build).
    """
    outputs = []
    for target_dir, triple in target_dirs:
        build = root / target_dir / (triple or "") / PROFILE_DIR / "build"
        for output in sorted(build.glob("*/output")):
            with contextlib.suppress(OSError):
                name = output.parent.name.rsplit("-", 1)[0]
                outputs.append((name, output.read_text(encoding="utf-8", errors="replace")))
    return outputs


def container_mounts(run: Run) -> list[tuple[str, str | None]]:
    """Container path → controller path of the build's mounts (the variant: watched apart)."""
    docker = run.cluster.controller.docker
    root = str(run.root)
    if isinstance(docker, DockerSettings):
        return [(docker.workspace, root), (docker.libtorch, None)]
    if isinstance(docker, ComposeService):
        return [(docker.workspace, root)]
    return []


def read_mountinfo() -> str:
    try:
        return Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def polling_choice(root: Path, forced: bool) -> tuple[bool, str]:
    """Whether to poll, and what to say about how the tree is watched."""
    if forced:
        return True, f"polling every {POLL_MS / 1000:g}s (fdl.watch_polling)"
    fstype = mount_fstype(read_mountinfo(), os.path.realpath(root))
    if fstype and needs_polling(fstype):
        return True, (
            f"polling every {POLL_MS / 1000:g}s: {root} is on {fstype}, where inotify does not "
            "see changes made on other hosts (edits there show up after the mount's "
            "attribute cache expires)"
        )
    return False, f"inotify on {fstype or 'an unknown filesystem'}"


# ---------------------------------------------------------------------------- the watcher

Changes = set[tuple[watchfiles.Change, str]]


class FileWatch:
    """``watchfiles`` over one :class:`WatchPlan`: a thread for the trees, one for the
    directories watched alone; every batch goes to ``deliver``."""

    def __init__(
        self,
        plan: WatchPlan,
        polling: bool,
        deliver: Callable[[Changes], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self.plan, self.polling = plan, polling
        self._deliver, self._failed = deliver, failed
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._watch, args=(paths, recursive), daemon=True, name="fdl-watch"
            )
            for paths, recursive in ((plan.recursive, True), (plan.flat, False))
            if paths
        ]

    def start(self) -> FileWatch:
        for thread in self._threads:
            thread.start()
        return self

    def _watch(self, paths: Sequence[str], recursive: bool) -> None:
        try:
            for changes in watchfiles.watch(
                *paths,
                watch_filter=None,
                debounce=_GROUP_MS,
                step=_STEP_MS,
                stop_event=self._stop,
                recursive=recursive,
                force_polling=True if self.polling else None,
                poll_delay_ms=POLL_MS,
                raise_interrupt=False,
                ignore_permission_denied=True,
            ):
                self._deliver(changes)
        except Exception as exc:
            if not self._stop.is_set():
                self._failed(exc)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)


class Session:
    """One ``prebuild --watch``: cycles in the main thread, file events from watcher threads."""

    def __init__(self, run: Run, command: str, crate: str, as_json: bool) -> None:
        self.run, self.command, self.crate, self.as_json = run, command, crate, as_json
        self.files = WatchFiles(run.root, command)
        self.root = posixpath.normpath(str(run.root))
        self.cluster_file = posixpath.normpath(os.path.abspath(run.settings.cluster_file))
        self.polling, self.how = polling_choice(run.root, run.settings.watch_polling)
        quiet = run.settings.watch_debounce
        if self.polling:
            quiet = max(quiet, 1.5 * POLL_MS / 1000)
        self.debouncer = Debouncer(quiet, _LONGEST_FACTOR * quiet, building=True)
        self.cv = threading.Condition()
        self.watch: FileWatch | None = None
        self.replan = False
        self.failures: list[BaseException] = []
        self.cycle = 0
        self.last_ok: bool | None = None
        self.snapshot: float | None = None
        self.reload = False
        self.probe = True
        self.target_dirs: list[tuple[str, str | None]] = []
        self.packages: dict[str, list[str]] | None = None
        self.scope = self.survey()
        self._state_lock = threading.Lock()
        self._written = ""
        self._state_error = False
        self._said: set[str] = set()
        self._restarts = 0

    # ---- scope and watchers ------------------------------------------------------------

    def survey(self) -> Scope:
        """The scope from cluster file, packages and the last builds' script outputs."""
        if self.packages is None:
            self.packages = package_dirs(self.root)
        archs = {w.arch for w in self.run.remotes if w.arch}
        outputs = build_outputs(self.run.root, self.target_dirs)
        declared, whole = declared_inputs(outputs, self.packages, container_mounts(self.run))
        declared = [p for p in declared if under(p, self.root) or os.path.exists(p)]
        dirs = [d for found in self.packages.values() for d in found]
        own = [str(self.files.directory)]
        cache = self.run.settings.compile_cache_dir
        if cache:
            own.append(os.path.abspath(os.path.expanduser(cache)))
        variants = [libtorch_dir(self.root, arch) for arch in archs]
        return make_scope(self.root, self.cluster_file, variants, dirs, declared, whole, own)

    def plan(self) -> WatchPlan:
        try:
            tops = [e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            tops = []
        return watch_plan(self.scope, tops, os.path.exists)

    def rewatch(self) -> None:
        """Watch what the plan says now; the new watcher starts before the old one stops,
        so no change falls between them."""
        plan = self.plan()
        if self.watch is not None and self.watch.plan == plan:
            return
        old, self.watch = self.watch, FileWatch(plan, self.polling, self.deliver, self.failed)
        self.watch.start()
        if old is not None:
            old.stop()

    def deliver(self, changes: Changes) -> None:
        """A watcher thread's batch: what counts joins the pending batch."""
        scope, relevant, replan = self.scope, {}, False
        for change, path in changes:
            if change == watchfiles.Change.added and os.path.isdir(path):
                replan = True  # a new directory: moved in whole, or a new top-level one
                if gone_directory(scope, path) is None:
                    continue  # a target dir, a cache: nothing in it can count
                for found in walk_files(path, scope.root, _NEW_DIR_FILES):
                    kind = scope.classify(found)
                    if kind is not None:
                        relevant[found] = kind
                continue
            kind = scope.classify(path)
            if change == watchfiles.Change.deleted:
                replan = True
                kind = kind or gone_directory(scope, path)
            if kind is not None:
                relevant[path] = kind
        with self.cv:
            self.debouncer.add(relevant, time.monotonic())
            self.replan = self.replan or replan
            self.cv.notify_all()
        if relevant:
            self.write_state()

    def failed(self, error: BaseException) -> None:
        with self.cv:
            self.failures.append(error)
            self.cv.notify_all()

    def recover(self) -> None:
        """A watcher thread died: watch again; out of inotify watches, poll instead."""
        with self.cv:
            failures, self.failures = self.failures, []
        for error in failures:
            text = str(error) or type(error).__name__
            if not self.polling and ("limit" in text.lower() or "No space" in text):
                self.polling = True
                self.how = f"polling every {POLL_MS / 1000:g}s (inotify: {text})"
                self.run.report(f"watch: inotify gave up ({text}); polling instead")
            elif text not in self._said:
                self.run.report(f"watch: the file watcher stopped ({text}); watching again")
            self._said.add(text)
        self.watch, old = None, self.watch
        if old is not None:
            old.stop()
        self._restarts += 1
        time.sleep(min(0.5 * 2 ** min(self._restarts, 5), 10.0))
        self.rewatch()

    # ---- state for launch ------------------------------------------------------------

    def write_state(self) -> None:
        with self.cv:
            state, queued = self.debouncer.state, self.debouncer.queued
        if state == "idle" and self.last_ok is False:
            state = "failed"
        data = {
            "version": 1,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "state": state,
            "queued": queued,
            "cycle": self.cycle,
            "snapshot": self.snapshot,
            "scope": self.scope.to_json(),
        }
        text = json.dumps(data, sort_keys=True)
        with self._state_lock:
            if text == self._written:
                return
            try:
                write_atomically(self.files.state, text + "\n")
                self._written = text
            except FdlError as exc:
                if not self._state_error:
                    self._state_error = True
                    self.run.report(f"watch: warning: {exc}; inv launch cannot wait for cycles")

    def touch_stamp(self) -> float | None:
        """The file system's time now (its clock stamps the sources' mtimes too)."""
        try:
            self.files.stamp.touch()
            os.utime(self.files.stamp, None)
            return self.files.stamp.stat().st_mtime
        except OSError:
            return None

    # ---- cycles ------------------------------------------------------------------------

    def next_batch(self) -> dict[str, Kind]:
        """Wait until the pending batch is due (handling watcher restarts meanwhile)."""
        while True:
            with self.cv:
                now = time.monotonic()
                if self.debouncer.due(now):
                    return self.debouncer.start()
                if not (self.replan or self.failures):
                    due = self.debouncer.due_at()
                    self.cv.wait(timeout=5.0 if due is None else max(0.0, due - now))
                    continue
                replan, self.replan = self.replan, False
            if self.failures:
                self.recover()
            elif replan:
                self.rewatch()

    def reload_cluster(self) -> None:
        cluster = load_cluster(self.run.settings.cluster_file)
        old = self.run.cluster.controller.path
        if cluster.controller.path != old:
            raise FdlError(
                f"controller.path changed from {old} to {cluster.controller.path}: stop this "
                "watcher (Ctrl-C) and start it again to watch the new tree"
            )
        self.run = attrs.evolve(self.run, cluster=cluster)
        self.reload = False

    def quiet_run(self, lines: list[str]) -> Run:
        """The run with progress kept back (warnings and waits still shown at once)."""
        report = self.run.report

        def keep(line: str) -> None:
            lines.append(line)
            if _passes_through(line):
                report(line)

        return attrs.evolve(self.run, report=keep)

    def run_cycle(self, batch: Mapping[str, Kind]) -> None:
        """One prebuild; a failure is reported and watching goes on."""
        self.cycle += 1
        first = self.cycle == 1
        started = time.monotonic()
        self.snapshot = self.touch_stamp()
        self.write_state()
        what = "initial prebuild" if first else describe_changes(batch, self.root)
        if Kind.CLUSTER in batch.values():
            self.reload = True
        if Kind.MANIFEST in batch.values():
            self.packages = None
        lines: list[str] = []
        try:
            if self.reload:
                self.reload_cluster()
                self.probe = True
            run = self.run if first else self.quiet_run(lines)
            published = pipeline.prebuild(run, self.command, self.crate, probe=self.probe)
        except FdlError as exc:
            if str(exc).startswith("interrupted"):
                raise Stopped(str(exc)) from None
            os.environ.pop(ENV_PREBUILD_PER_HOST, None)
            self.last_ok, self.probe = False, True
            for line in [*(line for line in lines if not _passes_through(line)), str(exc)]:
                for part in line.splitlines():
                    self.run.report(part)
            self.run.report(failed_line(self.cycle, time.monotonic() - started, what))
            return
        probed, self.last_ok, self.probe = self.probe and not first, True, False
        if published is None:  # --dry
            return
        os.environ[ENV_PREBUILD_PER_HOST] = published.text
        results = published.results
        self.target_dirs = sorted(
            {
                (r.job.target_dir, r.job.spec.cross.target if r.job.spec.cross else None)
                for r in results
            }
        )
        rebuilt = build_labels([r.job.spec for r in results if r.rebuilt])
        fresh = sum(1 for r in results if not r.rebuilt)
        delivery = published.delivery
        if delivery is None:
            verified = "verification off (--no-verify)"
        else:
            verified = f"{len(delivery.verified)} host(s) verified"
            if delivery.unverified:
                verified += f", {len(delivery.unverified)} not verified: " + "; ".join(
                    f"{host} ({why})" for host, why in sorted(delivery.unverified.items())
                )
        seconds = time.monotonic() - started
        self.run.report(cycle_line(self.cycle, seconds, what, rebuilt, fresh, verified, probed))
        if self.as_json:
            print(published.text, flush=True)

    def serve(self) -> None:
        """The first prebuild, then a cycle per settled batch of changes, until stopped."""
        self.rewatch()  # before the first build: edits made during it are not lost
        self.run.report(
            f"watch: watching {self.root} for {self.command}'s sources ({self.how}); "
            "the first cycle is a full prebuild; Ctrl-C stops"
        )
        batch: dict[str, Kind] = {}
        while True:
            self.run_cycle(batch)
            self.scope = self.survey()  # new variants, packages, build script inputs
            with self.cv:
                self.debouncer.finish()
            self.write_state()
            self.rewatch()
            batch = self.next_batch()

    def stopped_message(self) -> str:
        """What a stop leaves: the envelope the last good cycle published, or none."""
        during = f" during cycle {self.cycle}" if self.debouncer.building and self.cycle else ""
        if published_path(self.run.root, self.command).is_file():
            left = f"the envelope of {self.command} stays published"
            if self.last_ok and not during:
                left += f" (cycle {self.cycle}'s)"
        else:
            left = f"no envelope of {self.command} is published"
        return f"watch stopped{during}; {left}"

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        with contextlib.suppress(OSError):
            self.files.state.unlink(missing_ok=True)
        for partial in self.files.directory.glob(f".{self.files.state.name}.*.partial"):
            with contextlib.suppress(OSError):
                partial.unlink()


def _hold_lock(files: WatchFiles) -> IO[str]:
    """The watcher's lock, held for its lifetime: launch tells a live watcher by it."""
    try:
        files.directory.mkdir(parents=True, exist_ok=True)
        lock = files.lock.open("a+")
    except OSError as exc:
        raise FdlError(
            f"the target tree is not writable: cannot create {files.lock} ({exc})"
        ) from None
    deadline = time.monotonic() + 2.0  # a launch may hold it shared for an instant
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            lock.close()
            holder = _read_state(files.state) or {}
            raise FdlError(
                f"a prebuild watcher for {files.command} already runs on this project "
                f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}); stop it first"
            ) from None
        except OSError:
            return lock  # no locks on this file system: launch falls back to the pid


def watch_and_rebuild(run: Run, command: str, crate: str, *, as_json: bool = False) -> None:
    """``inv prebuild --watch``: a full prebuild, then one cycle per settled change.

    Returns only by :class:`Stopped` (Ctrl-C, SIGTERM); a failed cycle is
    reported and watching goes on.
    """
    if run.dry:
        run.report("watch: --dry prints the commands of one cycle and does not watch")
        pipeline.prebuild(run, command, crate)
        return
    lock = _hold_lock(WatchFiles(run.root, command))
    session: Session | None = None
    try:
        with sigterm_as_interrupt():
            session = Session(run, command, crate, as_json)
            session.serve()
    except (KeyboardInterrupt, Stopped):
        message = session.stopped_message() if session else "watch stopped before its first cycle"
        raise Stopped(message) from None
    finally:
        if session is not None:
            session.close()
        lock.close()


# ---------------------------------------------------------------------------- launch


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pid_alive(state: Mapping[str, Any]) -> bool:
    """Without file locks: the pid, when the watcher runs on this host (a watcher on
    another host cannot be asked: it counts as alive, and the wait is bounded)."""
    if state.get("host") != socket.gethostname():
        return True
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watcher_alive(files: WatchFiles, state: Mapping[str, Any]) -> bool:
    """The watcher holds its lock while it lives (the pid where locks do not work)."""
    try:
        lock = files.lock.open("r")
    except OSError:
        return _pid_alive(state)
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return _pid_alive(state)
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def busy_reason(state: Mapping[str, Any]) -> str | None:
    """Why launch must wait for the watcher, from its state alone (pure)."""
    cycle, phase = state.get("cycle"), state.get("state")
    if phase == "building":
        more = ", and a change waits for the next one" if state.get("queued") else ""
        return f"cycle {cycle} is building{more}"
    if phase == "pending":
        return "a change is waiting for its cycle"
    return None


def wait_for_watch(root: Path, command: str, timeout: float, report: Report) -> None:
    """Before a launch: let a running ``prebuild --watch`` publish what the sources say.

    Returns at once without a watcher (or with a dead one's state). Waits while
    a cycle is pending or building, or while a watched file is newer than the
    last cycle's start; raises :class:`FdlError` when the last cycle failed or
    when ``timeout`` seconds pass.
    """
    files = WatchFiles(root, command)
    started = time.monotonic()
    said: str | None = None
    unseen_since: float | None = None
    while True:
        state = _read_state(files.state)
        if state is None:
            return
        pid = state.get("pid", "?")
        if not watcher_alive(files, state):
            report(f"launch: ignoring the state of a prebuild watcher that has ended (pid {pid})")
            return
        reason = busy_reason(state)
        now = time.monotonic()
        if reason is None:
            unseen = _unseen_change(state)
            if unseen is None:
                if state.get("state") == "failed":
                    raise FdlError(
                        f"the prebuild watcher (pid {pid}) failed its last cycle "
                        f"({state.get('cycle')}), so {command} has no envelope: fix what it "
                        "reported and save"
                    )
                if said is not None:
                    report(f"launch: the watcher published cycle {state.get('cycle')}")
                return
            unseen_since = now if unseen_since is None else unseen_since
            reason = f"{unseen} changed after cycle {state.get('cycle')} started"
            if now - unseen_since > UNSEEN_GRACE:
                raise FdlError(
                    f"{reason}, but the prebuild watcher (pid {pid}) has not picked it up in "
                    f"{UNSEEN_GRACE:g}s: does it see this file system? (fdl.watch_polling)"
                )
        else:
            unseen_since = None
        if now - started > timeout:
            raise FdlError(
                f"the prebuild watcher (pid {pid}) has not published in {timeout:g}s "
                f"({reason}); not launching a binary older than the sources "
                "(fdl.launch_wait sets the bound)"
            )
        if reason != said:
            report(f"launch: waiting for the prebuild watcher (pid {pid}): {reason}")
            said = reason
        time.sleep(_LAUNCH_POLL)


def _unseen_change(state: Mapping[str, Any]) -> str | None:
    """A watched file newer than the last cycle's start (shown relative to the root)."""
    snapshot = state.get("snapshot")
    try:
        scope = Scope.from_json(state.get("scope") or {})
    except ValueError:
        return None
    if not isinstance(snapshot, int | float):
        return None
    newest = newest_change(scope)
    if newest is None or newest[0] <= snapshot:
        return None
    return _shown(newest[1], scope.root)
