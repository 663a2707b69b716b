"""The per-host envelope: what the launcher needs to exec a prebuilt binary.

The wire format must match the Rust consumer byte for byte: a JSON object
keyed by host label (sorted), compact separators, and inside each entry the
struct's declaration order ``bin``, ``ld_library_path``, ``cwd_subpath``,
the last omitted when empty and read as empty when absent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from fdl_tasks.errors import FdlError
from fdl_tasks.model import Worker
from fdl_tasks.rules import binary_path, libtorch_dir, require_arch

#: Carries the envelope map from prebuild to the launcher.
ENV_PREBUILD_PER_HOST = "FLODL_INTERNAL_PREBUILD_PER_HOST"


@attrs.frozen
class PerHostEnvelope:
    """One host's entry: mirrors the Rust ``PerHostEnvelope`` struct."""

    bin: str
    ld_library_path: str
    cwd_subpath: str = ""

    @classmethod
    def for_worker(cls, worker: Worker, command: str, crate_dir: str) -> PerHostEnvelope:
        """Paths in the worker's own view: ``bin`` relative to its ``path``."""
        arch = require_arch(worker)
        return cls(
            bin=binary_path(worker.host, arch, command),
            ld_library_path=f"{libtorch_dir(worker.path, arch)}/lib",
            cwd_subpath=crate_dir,
        )

    def to_wire(self) -> dict[str, str]:
        wire = {"bin": self.bin, "ld_library_path": self.ld_library_path}
        if self.cwd_subpath:
            wire["cwd_subpath"] = self.cwd_subpath
        return wire


def encode(envelopes: Mapping[str, PerHostEnvelope]) -> str:
    """The wire text; ``ensure_ascii=False`` because serde_json writes UTF-8 as is."""
    ordered = {host: envelopes[host].to_wire() for host in sorted(envelopes)}
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False)


def decode(text: str, source: str) -> dict[str, PerHostEnvelope]:
    """Parse wire text; malformed JSON or a missing field is a clear error naming ``source``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FdlError(
            f"{source}: the prebuild envelope is not valid JSON ({exc}); run prebuild again"
        ) from None
    if not isinstance(data, dict):
        raise FdlError(f"{source}: the prebuild envelope must be a JSON object keyed by host")
    envelopes = {}
    for host, entry in data.items():
        if not isinstance(entry, dict):
            raise FdlError(f"{source}: entry {host!r} must be an object")
        for field in ("bin", "ld_library_path"):
            if not isinstance(entry.get(field), str):
                raise FdlError(f"{source}: entry {host!r} lacks the string field {field!r}")
        cwd = entry.get("cwd_subpath", "")
        if not isinstance(cwd, str):
            raise FdlError(f"{source}: entry {host!r} has a non-string 'cwd_subpath'")
        envelopes[host] = PerHostEnvelope(entry["bin"], entry["ld_library_path"], cwd)
    return envelopes
