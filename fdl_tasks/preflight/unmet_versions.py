"""Symbol versions the dynamic linker cannot satisfy: ldd's "version `X' not found" lines.

Pure logic. A libtorch variant built against a newer glibc (or libstdc++) than
a host has passes every ``=> not found`` check, then dies at start with
``version `GLIBC_2.35' not found``; flodl's ``fdl probe`` reads the same lines.
The probe (:mod:`fdl_tasks.preflight.probe`, each shared object of the host's variant)
and delivery verification (:mod:`fdl_tasks.publish.verification`, the binary) both
pass ldd's output through :data:`UNMET_SED` and read it with :func:`parse_unmet`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

import attrs

from fdl_tasks.config.model import Worker
from fdl_tasks.config.variants import library_path, variant_lib
from fdl_tasks.gpu.auto_arch import AUTO

#: The answers' key: one ldd line each.
UNMET_KEY = "unmet"
#: sed program (for ``sed -n``): each ldd line naming an unmet version, as an answer.
UNMET_SED = f"/version .* not found/s/^/{UNMET_KEY}=/p"
#: How many of a variant's shared objects the probe hands to ldd, at most.
MAX_LIBRARIES = 64

# "/lib64/libc.so.6: version `GLIBC_2.35' not found (required by /x/libtorch_cpu.so)";
# newer glibc quotes with '…' instead of `…'.
_UNMET = re.compile(r"version [`'](?P<version>[^`']+)' not found \(required by (?P<by>.+)\)\s*$")


@attrs.frozen
class UnmetVersion:
    """One version a file needs that the host's libraries lack."""

    #: The file that needs it, as ldd names it (its "required by").
    library: str
    #: ``GLIBC_2.35``, ``GLIBCXX_3.4.30``, …
    version: str


def parse_unmet(lines: Iterable[str]) -> tuple[UnmetVersion, ...]:
    """Every unmet version in ldd's lines, once each, in the order ldd said them."""
    found = (_UNMET.search(line) for line in lines)
    unique = dict.fromkeys(
        UnmetVersion(m.group("by").strip(), m.group("version")) for m in found if m
    )
    return tuple(unique)


def unmet_text(unmet: Iterable[UnmetVersion]) -> str:
    """``libtorch_cpu.so needs GLIBC_2.35, GLIBCXX_3.4.30; libc10.so needs GLIBC_2.34``."""
    needs: dict[str, list[str]] = {}
    for item in unmet:
        needs.setdefault(item.library.rsplit("/", 1)[-1], []).append(item.version)
    return "; ".join(f"{name} needs {', '.join(versions)}" for name, versions in needs.items())


@attrs.frozen
class VariantLibraries:
    """A host's variant as the probe loads it: its ``lib`` and the launcher's library path."""

    arch: str
    lib: str
    library_path: str

    @classmethod
    def for_worker(cls, worker: Worker) -> VariantLibraries | None:
        """``None`` while the variant is not known (no arch, or ``auto``)."""
        arch = worker.arch
        if arch is None or arch == AUTO:
            return None
        return cls(arch, variant_lib(worker.path, arch), library_path(worker, arch))

    def lines(self) -> list[str]:
        """POSIX sh: ldd, with the launcher's ``LD_LIBRARY_PATH``, on each ``lib*.so``
        directly in ``lib`` (at most :data:`MAX_LIBRARIES`); unmet versions as answers."""
        ldd = f'LD_LIBRARY_PATH={shlex.quote(self.library_path)} ldd "$f" 2>&1'
        return [
            f"n=0; for f in {shlex.quote(self.lib)}/lib*.so; do "
            f'[ -f "$f" ] && [ "$n" -lt {MAX_LIBRARIES} ] || continue; n=$((n+1)); '
            f"{ldd} | sed -n {shlex.quote(UNMET_SED)}; done"
        ]

    def error(self, unmet: Iterable[UnmetVersion]) -> str:
        """What a host whose libraries lack these versions is told."""
        return (
            f"libtorch variant {self.arch} cannot load on this host: {unmet_text(unmet)}, "
            f"which this host's libraries lack (ldd in {self.lib}); the variant was built "
            "against a newer C or C++ library: use one built for an older baseline, or a "
            "newer distribution on this host"
        )
