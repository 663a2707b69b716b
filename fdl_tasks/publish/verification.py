"""Delivery verification: does each remote really see a runnable copy of the binary?

Pure logic (the controller's files are read by :mod:`fdl_tasks.core.binary_files`).
The script runs on each host in that host's own view of the paths; the verdict
compares its answers with the binary on the controller.
"""

from __future__ import annotations

import shlex

import attrs

from fdl_tasks.config.names import join_path
from fdl_tasks.core.binary_files import elf_machine
from fdl_tasks.preflight.unmet_versions import (
    UNMET_KEY,
    UNMET_SED,
    UnmetVersion,
    parse_unmet,
    unmet_text,
)
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.ssh.answers import BEGIN, END, HOST_FACT_LINES, glibc_version, marked_answers


def verification_script(worker_path: str, entry: PerHostEnvelope) -> str:
    """Hash the binary, read its ELF header, list unresolved libraries, report the host's
    libc and CPU architecture: one round trip, in the host's own view of the paths.

    The hash (the whole binary read through the host's mount, hundreds of MB for a
    libtorch command) and ``ldd`` (the variant's libraries mapped) run side by side: the
    last host's answer is on every prebuild's way to its envelope. ``ldd``'s lines are
    held in a variable and printed after ``wait``, so the two never share a line."""
    binary = shlex.quote(join_path(worker_path, entry.bin))
    library_path = shlex.quote(entry.ld_library_path)
    return "\n".join(
        [
            f"echo {BEGIN}",
            f"if [ -f {binary} ]; then (h=$(sha256sum {binary} | cut -d' ' -f1); "
            f"e=$(od -An -tu1 -N20 {binary} | tr -s ' \\n' ' '); "
            'printf \'sha256=%s\\nelf=%s\\n\' "$h" "$e") & else echo sha256=missing; fi',
            f"m=$(LD_LIBRARY_PATH={library_path} ldd {binary} 2>&1 | "
            "sed -n -e 's/^[[:space:]]*\\([^[:space:]]*\\) => not found.*/missing_lib=\\1/p' "
            f"-e {shlex.quote(UNMET_SED)})",
            *HOST_FACT_LINES,
            "wait",
            '[ -z "$m" ] || printf \'%s\\n\' "$m"',
            f"echo {END}",
            "exit 0",
        ]
    )


@attrs.frozen
class RemoteCopy:
    """What a host reported about its copy of the binary."""

    sha256: str | None
    missing_libraries: tuple[str, ...]
    glibc: tuple[int, int] | None = None
    cpu_arch: str | None = None  # the host's ``uname -m``
    binary_cpu_arch: str | None = None  # what the copy's ELF header says it is for
    #: Versions the binary or a library it loads needs that the host's libraries lack.
    unmet: tuple[UnmetVersion, ...] = ()


def parse_verification(stdout: str) -> RemoteCopy | None:
    answers = marked_answers(stdout)
    if answers is None:
        return None
    sha = answers.get("sha256")
    return RemoteCopy(
        sha256=None if sha in (None, "missing") else sha,
        missing_libraries=answers.every("missing_lib"),
        glibc=glibc_version(answers.get("libc")),
        cpu_arch=answers.get("cpu_arch") or None,
        binary_cpu_arch=elf_machine(answers.get("elf") or ""),
        unmet=parse_unmet(answers.every(UNMET_KEY)),
    )


def copy_problems(
    host: str, path: str, copy: RemoteCopy, expected_sha: str, needed_glibc: tuple[int, int] | None
) -> list[str]:
    """Every reason this host cannot run the binary the controller built."""
    problems = []
    if copy.sha256 is None:
        problems.append(f"{host}: {path} does not exist in this host's view of the mount")
    elif copy.sha256 != expected_sha:
        problems.append(
            f"{host}: {path} differs from the controller's build (remote sha256 "
            f"{copy.sha256[:16]}…, controller {expected_sha[:16]}…): stale or "
            "lagging shared mount"
        )
    if copy.cpu_arch and copy.binary_cpu_arch and copy.cpu_arch != copy.binary_cpu_arch:
        problems.append(
            f"{host}: {path} is a {copy.binary_cpu_arch} binary but the host is {copy.cpu_arch}: "
            "it cannot run there"
        )
    if copy.missing_libraries:
        problems.append(
            f"{host}: libraries not found with the envelope's LD_LIBRARY_PATH: "
            + ", ".join(copy.missing_libraries)
        )
    if copy.unmet:
        problems.append(
            f"{host}: versions not found with the envelope's LD_LIBRARY_PATH: "
            f"{unmet_text(copy.unmet)}"
        )
    remote_glibc = copy.glibc
    if needed_glibc and remote_glibc and remote_glibc < needed_glibc:
        problems.append(
            f"{host}: the binary needs glibc {needed_glibc[0]}.{needed_glibc[1]} "
            f"but the host has {remote_glibc[0]}.{remote_glibc[1]}"
        )
    return problems
