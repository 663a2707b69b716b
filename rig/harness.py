"""One harness for real ``inv`` runs on the rig, shared by the tests, ``bench/`` and the demo.

- :func:`bring_up`: dockerd and the builder image if asked for, a project tree with
  stub libtorch variants, the simulated hosts up, no host key remembered from an
  earlier rig;
- :func:`write_tasks_file`, :func:`write_cluster`, :func:`rig_worker`,
  :func:`builder_settings`: the files a run reads;
- :func:`isolated_env`, :func:`rig_env`: the environment of a run, without the
  caller's own fdl settings (``INVOKE_*``, ``FLODL_*``), and for a rig with its own
  ``known_hosts`` and no ssh config file at all;
- :func:`run_inv` (to the end) and :class:`Running` (in the background): the real
  entry point, ``python -m invoke``, in a directory with a plain ``tasks.py``;
- :func:`remove_our_containers`, :func:`containers`: build containers of our runs,
  which carry :data:`OWNER_LABEL` (:func:`builder_settings` adds it);
- :class:`RigCluster` and :func:`start_rig`: all of that around one running rig.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar

import yaml

import fdl_tasks
from fdl_tasks.build.docker_tools import remove_containers
from fdl_tasks.publish.envelope import PerHostEnvelope
from rig.docker_builder import (
    BUILDER_IMAGE,
    RIG_TAGS,
    ensure_builder_image,
    ensure_dockerd,
    toolchain_run_args,
)
from rig.project import make_project
from rig.sshrig import HostSpec, Rig

TASKS_PY = "from fdl_tasks import ns\n"
#: Every build container of a harness run carries this label, its value naming the owner.
OWNER_LABEL = "fdl-rig.owner"

# ---------------------------------------------------------------------------- set-up


def bring_up(
    rig: Rig,
    hosts: Sequence[HostSpec],
    project: Path,
    variants: Sequence[str] = (),
    *,
    known_hosts: Path | None = None,
    docker: bool = False,
) -> None:
    """dockerd and the image (``docker``), the project, a fresh ``known_hosts``, the hosts."""
    if docker:
        ensure_dockerd()
        ensure_builder_image(BUILDER_IMAGE, RIG_TAGS)
    project.mkdir(parents=True, exist_ok=True)
    if variants:
        make_project(project, variants)
    if known_hosts is not None:
        known_hosts.unlink(missing_ok=True)  # fresh host keys may come with a new rig
    rig.up(hosts)


def write_tasks_file(directory: Path) -> None:
    """A ``tasks.py`` that makes the collection the root namespace, as a user's would."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tasks.py").write_text(TASKS_PY)


def rig_worker(rig: Rig, name: str, project: Path, **fields: Any) -> dict[str, Any]:
    """The cluster file's entry for a rig host sharing ``project``, plus ``fields``."""
    return {
        "host": name,
        "path": str(project),
        "data_path": str(rig.data_path(name)),
        "ssh": rig.ssh_entry(name),
        **fields,
    }


def write_cluster(
    path: Path,
    controller: dict[str, Any],
    workers: Sequence[dict[str, Any]],
    env: dict[str, str] | None = None,
) -> Path:
    data = {"controller": controller, "workers": list(workers), "env": env or {}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@functools.cache
def _toolchain_run_args() -> tuple[str, ...]:
    return tuple(toolchain_run_args())


def builder_settings(owner: str) -> dict[str, Any]:
    """``controller.docker`` for the rig's builder image; containers labelled with ``owner``."""
    return {
        "image": f"{BUILDER_IMAGE}:{{cuda_tag}}",
        "cuda_version": "12.8",
        "run_args": [*_toolchain_run_args(), f"--label={OWNER_LABEL}={owner}"],
    }


# ---------------------------------------------------------------------------- runs


def isolated_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the caller's own fdl settings, plus ``extra``.

    Nor ``PYTHONDONTWRITEBYTECODE``: ``inv`` keeps its bytecode as on a user's machine
    (a shell that sets it would make every run compile each module changed since the
    last one that could write, a cost no user pays twice; benchmarks time ``inv``).
    """
    skipped = ("INVOKE_", "FLODL_", "PYTHONDONTWRITEBYTECODE")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    environment.update(extra or {})
    return environment


#: Connect and probe budgets of rig runs: far above what a loaded 2-core machine needs.
RIG_BUDGETS = {"INVOKE_FDL_CONNECT_TIMEOUT": "30", "INVOKE_FDL_PROBE_TIMEOUT": "120"}


def rig_env(root: Path, known_hosts: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Isolated, the controller labelled ``ctrl``, host keys in ``known_hosts``, no ssh config.

    Nor the machine's ``/etc/ssh/ssh_known_hosts``: the global known_hosts is a file
    of ``root`` that does not exist unless the test writes it
    (``INVOKE_FDL_GLOBAL_KNOWN_HOSTS`` in ``extra`` points elsewhere).

    Budgets are generous (:data:`RIG_BUDGETS`): a verdict must measure the host, never
    how busy the controller is; a test about budgets sets its own in ``extra``.
    """
    return isolated_env(
        {
            **RIG_BUDGETS,
            "FLODL_HOST_NAME": "ctrl",
            "INVOKE_FDL_KNOWN_HOSTS": str(known_hosts),
            "INVOKE_FDL_GLOBAL_KNOWN_HOSTS": str(root / "no-global-known-hosts"),
            "INVOKE_FDL_SSH_CONFIG": str(root / "no-ssh-config"),
            "INVOKE_FDL_SYSTEM_SSH_CONFIG": str(root / "no-system-ssh-config"),
            **(extra or {}),
        }
    )


def prebuild_args(cluster_file: Path, *options: str) -> list[str]:
    """``inv`` arguments: prebuild the fixture's ``ddp-bench`` for that cluster file."""
    return ["prebuild", "--cmd", "ddp-bench", *options, "--cluster-file", str(cluster_file)]


def inv_argv(*args: str) -> list[str]:
    """The real ``inv`` entry point, with this interpreter."""
    return [sys.executable, "-m", "invoke", *args]


def run_inv(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``inv`` as a user runs it, in ``cwd``, to the end (``env``: added to the isolated one)."""
    return subprocess.run(
        inv_argv(*args),
        cwd=cwd,
        text=True,
        capture_output=True,
        env=isolated_env(env),
        timeout=timeout,
        check=False,
    )


class Running:
    """A process in the background whose output is collected as it comes.

    Each stderr line is kept with the seconds after the start at which it
    arrived. Runs not finished yet are listed in :attr:`live`.
    """

    live: ClassVar[list[Running]] = []

    def __init__(
        self,
        argv: Sequence[str],
        cwd: Path | None,
        env: dict[str, str] | None,
        stdin: int | None = None,
    ) -> None:
        self.lines: list[tuple[float, str]] = []
        self._stdout: list[str] = []
        self.ended: float | None = None
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=stdin,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(stream, keep), daemon=True)
            for stream, keep in (
                (self.process.stdout, self._stdout.append),
                (self.process.stderr, self._arrived),
            )
        ]
        for reader in self._readers:
            reader.start()
        Running.live.append(self)

    @staticmethod
    def _read(stream: IO[str], keep: Callable[[str], None]) -> None:
        for line in stream:
            keep(line)

    def _arrived(self, line: str) -> None:
        self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    @property
    def seconds(self) -> float:
        """Wall time from the start to the exit (so far, while it runs)."""
        return (time.monotonic() if self.ended is None else self.ended) - self.started

    @property
    def stdout(self) -> str:
        return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        return "".join(f"{text}\n" for _, text in self.lines)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60) -> None:
        """Until ``predicate()`` holds; fails if the process ends or time runs out first."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.process.poll() is None, self.stderr
            assert time.monotonic() < deadline, self.stderr
            time.sleep(0.1)

    def finish(self, timeout: float = 120) -> int:
        """Its exit code, once it has exited and all its output is read."""
        code = self.process.wait(timeout=timeout)
        if self.ended is None:
            self.ended = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=10)
        with contextlib.suppress(ValueError):
            Running.live.remove(self)
        return code

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C (SIGINT) if it still runs, SIGKILL if that does not end it in ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.finish(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.finish(timeout)

    @classmethod
    def stop_all(cls) -> None:
        """Stop every run not finished yet (a failed test must not leave one behind)."""
        for run in list(cls.live):
            run.stop()


# ---------------------------------------------------------------------------- containers


def containers(*labels: str, running: bool = False) -> list[str]:
    """Ids of the containers carrying all ``labels`` (``key`` or ``key=value``)."""
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    listed = subprocess.run(
        ["docker", "ps", "-q", *([] if running else ["-a"]), *filters],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def remove_our_containers(owner: str) -> list[str]:
    """Remove the build containers of ``owner``'s runs still present; what could not be."""
    return remove_containers(f"{OWNER_LABEL}={owner}")


# ---------------------------------------------------------------------------- a rig


class RigCluster:
    """A running rig, its project, and the cluster files and ``inv`` runs made for it."""

    def __init__(self, rig: Rig, root: Path, project: Path) -> None:
        self.rig, self.root, self.project = rig, root, project
        self.known_hosts = root / "known_hosts"

    @property
    def owner(self) -> str:
        """The :data:`OWNER_LABEL` value of this rig's build containers."""
        return str(self.root)

    def worker(self, name: str, **fields: Any) -> dict[str, Any]:
        return rig_worker(self.rig, name, self.project, **fields)

    def write(
        self, workers: Sequence[dict[str, Any]], name: str = "cluster.yaml", **controller: Any
    ) -> Path:
        """``name`` in the rig's root: the project as the controller's path, plus ``controller``."""
        controller = {"path": str(self.project), **controller}
        return write_cluster(self.root / name, controller, workers, {"FDL_TEST": "1"})

    def docker_settings(self) -> dict[str, Any]:
        return builder_settings(self.owner)

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Isolated from the user's fdl settings and ssh files, pointed at this rig."""
        return rig_env(self.root, self.known_hosts, env)

    def inv(
        self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The real ``inv`` entry point, run in the rig's root to the end."""
        return run_inv(self.root, *args, env=self.environment(env), timeout=timeout)

    def background(self, *args: str, env: dict[str, str] | None = None) -> Running:
        """The real ``inv`` entry point, run in the rig's root in the background."""
        return Running(inv_argv(*args), self.root, self.environment(env))

    def run_on_host(self, host: str, worker_path: str, entry: PerHostEnvelope) -> str:
        """What the launcher does, by hand, over the host's own sshd: the first line printed."""
        command = (
            f"cd {shlex.quote(worker_path + '/' + entry.cwd_subpath)} && "
            f"LD_LIBRARY_PATH={shlex.quote(entry.ld_library_path)} "
            f"{shlex.quote(worker_path + '/' + entry.bin)}"
        )
        done = subprocess.run(
            self.rig.ssh_argv(host, command),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(done.stderr)
        return done.stdout.splitlines()[0]


@functools.cache
def compile_package() -> None:
    """The package's bytecode, written once per process as ``pip install`` writes an
    installed package's: ``inv`` never writes any (Invoke sets ``sys.dont_write_bytecode``
    unless ``--write-pyc``), so every ``inv`` of a rig would compile again each module
    changed since the last other process that imported it, where a user's installed
    copy loads its bytecode (the benchmarks time ``inv``)."""
    compileall.compile_dir(str(Path(fdl_tasks.__file__).parent), quiet=1)


@contextlib.contextmanager
def start_rig(
    tmp: Path, hosts: Sequence[HostSpec], variants: Sequence[str] = (), docker: bool = False
) -> Iterator[RigCluster]:
    """The hosts up, a project with those libtorch variants, and dockerd if asked for.

    On the way out: the hosts down, and (``docker``) any build container of the rig's
    runs still present removed.
    """
    cluster = RigCluster(Rig(tmp / "rig"), tmp, tmp / "project")
    compile_package()
    try:
        bring_up(cluster.rig, hosts, cluster.project, variants, docker=docker)
        write_tasks_file(tmp)
        yield cluster
    finally:
        if docker:
            remove_our_containers(cluster.owner)
        cluster.rig.down()
