"""The preflight probe: the shell script sent to each host, its parsing, the verdicts.

Pure logic; :mod:`fdl_tasks.ssh.remote` carries the script over ssh. One script
per host answers everything in one round trip, as ``key=value`` lines
between markers so that a login banner or a chatty shell rc cannot confuse
the parser.
"""

from __future__ import annotations

import shlex
from typing import Literal

import attrs

from fdl_tasks.config.model import DEFAULT_DATA_PATH, Controller, Worker
from fdl_tasks.gpu.gpu_probe import GPU_FACT_LINES, gpu_report
from fdl_tasks.gpu.gpus import GpuReport
from fdl_tasks.preflight.host_paths import KEYS, HostPaths
from fdl_tasks.preflight.nccl import (
    HEADER_KEY,
    LIB_KEY,
    SYSTEM_KEY,
    NcclSources,
    NcclVersion,
    parse_nccl,
)
from fdl_tasks.preflight.unmet_versions import (
    UNMET_KEY,
    UnmetVersion,
    VariantLibraries,
    parse_unmet,
)
from fdl_tasks.ssh.answers import BEGIN, END, HOST_FACT_LINES, glibc_version, marked_answers

Status = Literal["ok", "warning", "error"]
DataState = Literal["ok", "missing", "unreadable"]


@attrs.frozen
class ProbeRequest:
    """What to ask one host; hosts with equal requests share one Fabric group."""

    data_path: str
    data_declared: bool
    abi: bool
    #: A remote host's own directories (``None``: the controller, checked apart).
    paths: HostPaths | None = None
    #: With ``abi``, a remote host's variant, once known: can its shared objects load?
    variant: VariantLibraries | None = None
    #: With ``abi``, where a remote NVIDIA host's NCCL is read, once its variant is known.
    nccl: NcclSources | None = None

    @classmethod
    def for_host(
        cls, host: Worker | Controller, abi: bool, crate: str | None = None, source: str = ""
    ) -> ProbeRequest:
        """``crate``: the command's crate dir, once known; ``source``: the cluster file."""
        declared = host.data_path is not None
        paths = HostPaths.for_worker(host, crate, source) if isinstance(host, Worker) else None
        worker = host if abi and isinstance(host, Worker) else None
        variant = VariantLibraries.for_worker(worker) if worker else None
        nccl = NcclSources.for_worker(worker) if worker else None
        return cls(host.data_path or DEFAULT_DATA_PATH, declared, abi, paths, variant, nccl)

    def script(self) -> str:
        """POSIX sh that always exits 0 and prints every fact between the markers.

        On a host with a GPU tool (``nvidia-smi`` can take a second to wake a driver), it
        runs beside ``ldd`` on the variant's libraries (each one's dependencies mapped):
        preflight waits for its slowest host before any build. ``ldd``'s answers are then
        held until ``wait``, so no line is shared; the rest are short lines, each written
        whole. A host without one pays no extra process."""
        path = shlex.quote(self.data_path)
        lines = [
            f"echo {BEGIN}",
            f"if [ -d {path} ]; then if [ -r {path} ] && [ -x {path} ]; then echo data=ok; "
            "else echo data=unreadable; fi; else echo data=missing; fi",
        ]
        if self.paths is not None:
            lines += self.paths.lines()
        if self.abi:
            libs = "; ".join(self.variant.lines()) if self.variant else ":"
            lines += [
                *HOST_FACT_LINES,
                "if command -v pkill >/dev/null 2>&1; then echo pkill=yes; else echo pkill=no; fi",
                # one line each: ``inv --dry`` shows the script's lines joined by "; "
                "fdl_gpus() { " + "; ".join(GPU_FACT_LINES) + "; }",
                f"fdl_libs() {{ {libs}; }}",
                "if command -v nvidia-smi >/dev/null 2>&1 || command -v rocminfo >/dev/null 2>&1; "
                "then fdl_gpus & u=$(fdl_libs); else fdl_gpus; fdl_libs; u=; fi",
                *(self.nccl.lines() if self.nccl else ()),
                "wait",
                '[ -z "$u" ] || printf \'%s\\n\' "$u"',
            ]
        lines += [f"echo {END}", "exit 0"]
        return "\n".join(lines)


@attrs.frozen
class ProbeFacts:
    """What a host answered; ``None`` where it answered nothing usable."""

    data: DataState | None
    cpu_arch: str | None = None
    libc: str | None = None
    pkill: bool | None = None
    gpus: GpuReport | None = None
    #: Which of the host's own directories (:data:`host_paths.KEYS`) are missing.
    missing: frozenset[str] = frozenset()
    #: What the variant's shared objects need that the host's libraries lack.
    unmet: tuple[UnmetVersion, ...] = ()
    #: The NCCL its variant brings (``None``: not asked, none, or not found).
    nccl: NcclVersion | None = None

    @property
    def musl(self) -> bool:
        return self.libc is not None and "musl" in self.libc.lower()

    @property
    def glibc(self) -> tuple[int, int] | None:
        return glibc_version(self.libc)


def parse_facts(stdout: str) -> ProbeFacts | None:
    """The facts between the markers; ``None`` if the probe's output is incomplete."""
    answers = marked_answers(stdout)
    if answers is None:
        return None
    data, pkill = answers.get("data"), answers.get("pkill")
    return ProbeFacts(
        data=data if data in ("ok", "missing", "unreadable") else None,  # type: ignore[arg-type]
        cpu_arch=answers.get("cpu_arch") or None,
        libc=answers.get("libc") or None,
        pkill=None if pkill is None else pkill == "yes",
        gpus=gpu_report(answers),
        missing=frozenset(key for key in KEYS if answers.get(key) == "missing"),
        unmet=parse_unmet(answers.every(UNMET_KEY)),
        nccl=parse_nccl(*(answers.every(key) for key in (LIB_KEY, HEADER_KEY, SYSTEM_KEY))),
    )


@attrs.frozen
class ControllerAbi:
    """The controller side of the ABI gate (not a build environment): the CPU and glibc
    every build runs on; ``cross`` holds the CPU architectures it can also build for."""

    cpu_arch: str
    glibc: tuple[int, int] | None
    cross: frozenset[str] = frozenset()


@attrs.frozen
class HostVerdict:
    """One host's preflight result."""

    host: str
    status: Status
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    facts: ProbeFacts | None = None
    data_path: str = ""
    local: bool = False
    #: What could not be checked: reported, never changing the status.
    notes: tuple[str, ...] = ()
    #: The GPU coverage verdict (:class:`fdl_tasks.gpu.coverage.Coverage` as JSON), once judged.
    coverage: dict[str, object] | None = None
    #: The arch ``arch: auto`` chose for the host.
    arch: str | None = None
    #: Why the host could not be asked: an ssh failure's kind (``outcomes.FailureKind``'s value).
    failure: str | None = None

    def to_json(self) -> dict[str, object]:
        facts = self.facts
        return {
            "host": self.host,
            "status": self.status,
            "local": self.local,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "data_path": self.data_path,
            **{key: getattr(facts, key, None) for key in ("data", "cpu_arch", "libc", "pkill")},
            "gpus": facts.gpus.to_json()["gpus"] if facts and facts.gpus else None,
            "gpu_tools": list(facts.gpus.tools) if facts and facts.gpus else None,
            "nccl": str(facts.nccl) if facts and facts.nccl else None,
            "coverage": self.coverage,
            "arch": self.arch,
            "notes": list(self.notes),
            "failure": self.failure,
        }


def _version(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def judge(
    host: str,
    request: ProbeRequest,
    facts: ProbeFacts | None,
    controller: ControllerAbi,
    *,
    local: bool = False,
    pinned: str | None = None,
) -> HostVerdict:
    """Apply SPEC's preflight policy to what one host answered."""
    errors: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    path = request.data_path
    if facts is None or facts.data is None:
        warnings.append("the probe gave no usable answer; checks skipped")
    elif facts.data == "missing" and request.data_declared:
        errors.append(f"declared data_path {path} is missing (is the shared mount up?)")
    elif facts.data == "missing":
        notes.append(default_data_note(path))
    elif facts.data == "unreadable":
        errors.append(f"data_path {path} exists but is not readable by the login user")
    if request.paths is not None and facts is not None:
        errors += request.paths.errors(host, facts.missing)
    if request.abi and facts is not None:
        _abi_gate(facts, controller, pinned, errors, warnings)
    if request.variant is not None and facts is not None and facts.unmet:
        errors.append(request.variant.error(facts.unmet))
    status: Status = "error" if errors else "warning" if warnings else "ok"
    return HostVerdict(
        host, status, tuple(errors), tuple(warnings), facts, path, local, tuple(notes)
    )


def default_data_note(path: str) -> str:
    """A host declaring no ``data_path`` lacks the convention default: harmless without
    shared storage (flodl warns), so a note, said once for all such hosts."""
    return f"default data_path {path} is missing (fine without shared storage)"


def _abi_gate(
    facts: ProbeFacts,
    controller: ControllerAbi,
    pinned: str | None,
    errors: list[str],
    warnings: list[str],
) -> None:
    cpu_arch = pinned or facts.cpu_arch
    if pinned and facts.cpu_arch and pinned != facts.cpu_arch:
        errors.append(f"cpu_arch pins {pinned}, but 'uname -m' says {facts.cpu_arch}")
    elif cpu_arch is None:
        warnings.append("'uname -m' gave no answer: CPU architecture not checked")
    elif cpu_arch != controller.cpu_arch and cpu_arch not in controller.cross:
        errors.append(
            f"CPU architecture {cpu_arch} differs from the build environment's "
            f"{controller.cpu_arch} and controller.cross has no entry for {cpu_arch}: add "
            f"'cross: {{{cpu_arch}: {{}}}}' under controller (with an 'image:' or "
            "'service:' that can cross-build, in Docker) to build it its own binary"
        )
    if facts.musl:
        errors.append("musl libc: the build images are glibc-based, the binary cannot run there")
    elif facts.glibc is None:
        warnings.append(f"libc not recognised ({facts.libc or 'no answer from ldd --version'})")
    elif controller.glibc is not None and facts.glibc < controller.glibc:
        warnings.append(
            f"glibc {_version(facts.glibc)} is older than the build environment's "
            f"{_version(controller.glibc)}: the binary's real needs are checked after "
            "the build"
        )
    if facts.pkill is False:
        warnings.append("pkill not found: orphan clean-up after a failed run is degraded")


def unreachable(host: str, request: ProbeRequest, reason: str) -> HostVerdict:
    """A probe never makes things worse than no probe: unreachable is a warning."""
    return HostVerdict(host, "warning", (), (f"unreachable: {reason}",), None, request.data_path)
