"""Native builds: the controller's own cargo, in a session of its own.

A timeout or a stop kills the build's process group: cargo and every rustc
it started (and, with the compile cache, the build's sccache server).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fdl_tasks.build.backends.protocol import RunBackend
from fdl_tasks.build.build_argv import cargo_argv, cross_variables
from fdl_tasks.build.build_environment import BuildEnvironment, BuildJob, NoEnvironment
from fdl_tasks.build.build_record import RECORD_RUN_ID, RecordInputs
from fdl_tasks.build.readiness import cross_std_missing, has_std
from fdl_tasks.cache.compile_cache import CompileCache, stop_server, with_stats
from fdl_tasks.config.model import Arch, BuildMode, Controller, CrossSetup
from fdl_tasks.config.names import join_path
from fdl_tasks.config.variants import libtorch_dir
from fdl_tasks.core.errors import FdlError
from fdl_tasks.gpu.gpus import Vendor


def native_server(run_id: str, job_name: str) -> str:
    """The socket of a native build's own sccache server (short: Unix sockets allow ~107)."""
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:12]
    return f"/tmp/fdl-sccache-{run_id}-{digest}.sock"


def native_line(
    job: BuildJob, controller: Controller, cache: CompileCache | None = None, run_id: str = ""
) -> str:
    """The same cargo build on the controller, in its own session (``exec setsid``).

    Its process id is then its process group, so a timeout or an interrupt
    can stop cargo together with every rustc it started. With the compile
    cache the target dir is passed as ``--target-dir``: sccache hashes every
    ``CARGO_*`` variable, so ``CARGO_TARGET_DIR`` would make every variant miss.
    """
    crate = join_path(controller.path, job.build.crate_dir)
    target = join_path(controller.path, job.target_dir)
    env = [f"LIBTORCH_PATH={libtorch_dir(controller.path, job.build.arch)}"]
    env += [f"{k}={v}" for k, v in cross_variables(job.build).items()]
    if cache is None:
        argv = ["env", env[0], f"CARGO_TARGET_DIR={target}", *env[1:], *cargo_argv(job.build)]
    else:
        server = native_server(run_id, job.name)
        env += [f"{k}={v}" for k, v in cache.native_variables(server).items()]
        build = shlex.join([*cargo_argv(job.build), "--target-dir", target])
        argv = ["env", *env, "sh", "-c", with_stats(build, cache.binary, target)]
    return f"cd {shlex.quote(crate)} && exec " + shlex.join(["setsid", *argv])


#: Variables two shells of one user differ by, which no build reads.
SHELL_NOISE = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "TERM", "COLUMNS", "LINES"})


def native_identity(crate_dir: str) -> str | None:
    """What this machine's cargo reads besides the project (the native mode's
    counterpart of an image's content id): the Rust release that runs in
    ``crate_dir`` (``rustc -vV``, ``cargo -V``: a ``rust-toolchain`` file or a rustup
    update changes them), every cargo configuration above the project and in its home,
    and the environment (a build script may read any variable; not the envelope this
    process hands over after each publication); ``None`` when the Rust release cannot
    be asked."""
    parts = []
    for argv in (["rustc", "-vV"], ["cargo", "-V"]):
        try:
            done = subprocess.run(
                argv, cwd=crate_dir, capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        parts.append(done.stdout)
    home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    directories = [home, *(d / ".cargo" for d in Path(crate_dir).parents)]
    for config in (d / n for d in directories for n in ("config.toml", "config")):
        try:
            parts.append(f"{config}: {config.read_text(encoding='utf-8', errors='replace')}")
        except OSError:
            continue
    environment = sorted(
        (k, v)
        for k, v in os.environ.items()
        if k not in SHELL_NOISE and not k.startswith(("SSH_", "FLODL_INTERNAL_"))
    )
    parts += [f"{k}={v}" for k, v in environment]
    return "\n".join(parts)


class NativeBackend(RunBackend):
    """``cargo build`` on the controller, ``LIBTORCH_PATH`` naming the variant."""

    tool = "native cargo"
    killers = "the out-of-memory killer, or another process"
    mode: BuildMode = "native"
    toolchain_key = ""

    @functools.cached_property
    def identities(self) -> dict[str, str | None]:
        """Each crate dir's :func:`native_identity`, asked once per run."""
        return {}

    def toolchain(
        self, arch: Arch, vendor: Vendor, cross: CrossSetup | None
    ) -> str | NoEnvironment:
        return ""  # this machine's cargo, whatever the variant

    def mounts(self) -> list[tuple[str, str | None]]:
        return []  # no container: paths are the controller's

    def check(self, environments: Sequence[BuildEnvironment]) -> None:
        """cargo on PATH, and each cross target's ``std`` installed for this machine's rustc."""
        if shutil.which("cargo") is None:
            raise FdlError(
                "cargo is not on PATH: install Rust (rustup) on the controller, or set "
                f"controller.docker in {self.source} to build inside a container"
            )
        targets = {e.cross.target: e.cross.cpu_arch for e in environments if e.cross}
        missing = {t: why for t in targets if (why := self.std_problem(t))}
        if missing:
            raise FdlError(cross_std_missing(missing, targets))

    def std_problem(self, target: str) -> str:
        """Why rustc cannot build for ``target`` ("" when it can), asked as cargo would ask
        it: ``$RUSTC`` or ``rustc``, in the project (a ``rust-toolchain`` file applies)."""
        rustc = os.environ.get("RUSTC") or "rustc"
        argv = [rustc, "--print", "target-libdir", "--target", target]
        cwd = self.controller.path if os.path.isdir(self.controller.path) else None
        try:
            answer = subprocess.run(
                argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{shlex.join(argv)} failed: {exc}"
        if answer.returncode != 0:
            last = (answer.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{shlex.join(argv)} exited {answer.returncode}: {last}"
        libdir = Path(answer.stdout.strip())
        try:
            names = os.listdir(libdir)
        except OSError:
            names = []
        return "" if has_std(names) else f"no libstd in {libdir}"

    def build_line(self, job: BuildJob) -> str:
        return native_line(job, self.controller, self.cache, self.run_id)

    def exit_problem(self, exit_code: int, log_tail: str) -> str | None:
        """None: a native build's exit code is cargo's own."""
        return None

    def record_inputs(self, job: BuildJob) -> RecordInputs:
        """The build line and :func:`native_identity` (asked once per crate dir and
        run); none for a ``--timings`` build (its report comes from cargo). The paths are
        the controller's; only the project's are recorded (what ``~/.cargo`` holds is
        immutable once downloaded)."""
        mounts = ((self.controller.path, self.controller.path),)
        crate = join_path(self.controller.path, job.build.crate_dir)
        if crate not in self.identities:
            self.identities[crate] = native_identity(crate)
        identity = self.identities[crate]
        if identity is None or job.build.timings:
            return RecordInputs(None, mounts)
        line = native_line(job, self.controller, self.cache, RECORD_RUN_ID)
        return RecordInputs(f"{identity}\n{line}", mounts)

    def stop_job(self, job: BuildJob, process: int | None) -> list[str]:
        """The build's process group (its id is the process's: ``exec setsid``)."""
        left = []
        if process is not None:
            try:
                os.killpg(process, signal.SIGKILL)
            except ProcessLookupError:
                pass  # ended meanwhile
            except PermissionError as exc:
                left.append(
                    f"the build process group {process} of {job.name} could not be stopped "
                    f"({exc}); stop it with kill -KILL -- -{process}"
                )
        if self.cache:
            stop_server(self.cache, native_server(self.run_id, job.name))
        return left

    def stop_run(self) -> list[str]:
        """Every job was stopped one by one: its process group is all there is."""
        return []

    def run_note(self) -> str:
        return ""
