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
from cattrs.gen import make_dict_unstructure_fn, override

from fdl_tasks.converter import CONVERTER, IGNORE_EXTRA_KEYS, structure
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
    def for_worker(
        cls, worker: Worker, command: str, crate_dir: str, cross: str | None = None
    ) -> PerHostEnvelope:
        """Paths in the worker's own view: ``bin`` relative to its ``path``.

        ``cross``: the worker's CPU architecture when the controller cross-builds for it.
        """
        arch = require_arch(worker)
        return cls(
            bin=binary_path(worker.host, arch, command, cross),
            ld_library_path=f"{libtorch_dir(worker.path, arch)}/lib",
            cwd_subpath=crate_dir,
        )


# serde's ``skip_serializing_if = "String::is_empty"`` on the way out; on the way
# in, unknown fields are ignored as serde does (no ``deny_unknown_fields``).
CONVERTER.register_unstructure_hook(
    PerHostEnvelope,
    make_dict_unstructure_fn(
        PerHostEnvelope, CONVERTER, cwd_subpath=override(omit_if_default=True)
    ),
)
IGNORE_EXTRA_KEYS.add(PerHostEnvelope)


def encode(envelopes: Mapping[str, PerHostEnvelope]) -> str:
    """The wire text; ``ensure_ascii=False`` because serde_json writes UTF-8 as is."""
    ordered = {host: CONVERTER.unstructure(envelopes[host]) for host in sorted(envelopes)}
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
    return structure(data, dict[str, PerHostEnvelope], f"{source}: a malformed prebuild envelope")
