"""The per-host envelope: what the launcher needs to exec a prebuilt binary.

The wire format must match the Rust consumer byte for byte: a JSON object
keyed by host label (sorted), compact separators, and inside each entry the
struct's declaration order ``bin``, ``ld_library_path``, ``cwd_subpath``,
the last omitted when empty and read as empty when absent. Reading accepts
every envelope the Rust serializer can write: checking values belongs to the
cluster file's edge, not to the wire format.

Each command's envelope is published in a file of its own
(:func:`fdl_tasks.config.layout.envelope_file`), so building one command never
withdraws another's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import attrs

from fdl_tasks.config.converter import structure
from fdl_tasks.config.launch_mode import ENV_PREBUILD_PER_HOST
from fdl_tasks.config.layout import envelope_file, host_binary
from fdl_tasks.config.model import WireText, Worker
from fdl_tasks.config.variants import library_path, require_arch
from fdl_tasks.core.atomic_files import write_atomically
from fdl_tasks.core.errors import FdlError


@attrs.frozen
class PerHostEnvelope:
    """One host's entry: mirrors the Rust ``PerHostEnvelope`` struct."""

    bin: WireText
    ld_library_path: WireText
    cwd_subpath: WireText = ""
    #: Unknown keys are ignored, as serde reads it without ``deny_unknown_fields``.
    lenient: ClassVar[bool] = True

    @classmethod
    def for_worker(
        cls, worker: Worker, command: str, crate_dir: str, cpu_arch: str | None = None
    ) -> PerHostEnvelope:
        """Paths in the worker's own view: ``bin`` relative to its ``path``.

        ``cpu_arch``: the worker's CPU architecture when the controller cross-builds for it.
        """
        arch = require_arch(worker)
        return cls(
            bin=host_binary(worker.host, arch, command, cpu_arch),
            ld_library_path=library_path(worker, arch),
            cwd_subpath=crate_dir,
        )


def _wire(envelope: PerHostEnvelope) -> dict[str, str]:
    """serde's ``skip_serializing_if = "String::is_empty"`` on ``cwd_subpath``."""
    return {k: v for k, v in attrs.asdict(envelope).items() if v or k != "cwd_subpath"}


def encode(envelopes: Mapping[str, PerHostEnvelope]) -> str:
    """The wire text; ``ensure_ascii=False`` because serde_json writes UTF-8 as is."""
    ordered = {host: _wire(envelopes[host]) for host in sorted(envelopes)}
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
    return structure(
        data, dict[WireText, PerHostEnvelope], f"{source}: a malformed prebuild envelope"
    )


def is_for_command(envelopes: Mapping[str, PerHostEnvelope], command: str) -> bool:
    """Every entry runs ``command`` (the binary's file name is the command)."""
    return bool(envelopes) and all(e.bin.rsplit("/", 1)[-1] == command for e in envelopes.values())


def published_path(root: Path, command: str) -> Path:
    return root / envelope_file(command)


def publish(root: Path, command: str, envelopes: Mapping[str, PerHostEnvelope]) -> str:
    """Write ``command``'s envelope file atomically; returns the wire text."""
    text = encode(envelopes)
    write_atomically(published_path(root, command), text + "\n")
    return text


def withdraw(root: Path, command: str) -> None:
    """Remove ``command``'s envelope: its binaries are about to change."""
    published_path(root, command).unlink(missing_ok=True)


def hand_over(text: str | None) -> None:
    """The envelope this process just published, for a launch in the same process; ``None``
    when none is valid. The one place the process environment is written."""
    if text is None:
        os.environ.pop(ENV_PREBUILD_PER_HOST, None)
    else:
        os.environ[ENV_PREBUILD_PER_HOST] = text


def read_published(root: Path, command: str) -> tuple[dict[str, PerHostEnvelope], str, str]:
    """``command``'s envelope, where it came from and its wire text:
    ``$FLODL_INTERNAL_PREBUILD_PER_HOST`` when it holds this command's (a prebuild in this
    process set it), else the file."""
    text = os.environ.get(ENV_PREBUILD_PER_HOST)
    if text:
        from_environment = decode(text, f"${ENV_PREBUILD_PER_HOST}")
        if is_for_command(from_environment, command):
            return from_environment, f"${ENV_PREBUILD_PER_HOST}", text
    path = published_path(root, command)
    if (text := read_text(path)) is None:
        raise FdlError(
            f"{command!r} has no published envelope ({path} does not exist): "
            f"run inv prebuild --cmd {command} first"
        )
    return decode(text, str(path)), str(path), text.rstrip("\n")


def read_text(path: Path) -> str | None:
    """The envelope file's text, ``None`` when there is none; unreadable is an error."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise FdlError(f"cannot read the envelope {path}: {exc}") from None


def read_file(path: Path) -> dict[str, PerHostEnvelope] | None:
    """The envelope in ``path``, ``None`` when there is none; unreadable or malformed is an
    error naming the file."""
    text = read_text(path)
    return None if text is None else decode(text, str(path))
