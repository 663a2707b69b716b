"""Single-value rules for cluster.yaml: each kind of :mod:`fdl_tasks.model` has a check.

Pure functions, no I/O. A check returns the value (possibly normalised) or
raises :class:`InvalidValue` with a message that quotes the value cut short,
so that one bad 10 kB value still makes a one-line message.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from fdl_tasks.model import (
    AbsPath,
    Arch,
    CpuArch,
    CudaRelease,
    EnvName,
    EnvValue,
    HostLabel,
    LaunchEnvName,
    Port,
    Program,
    RamShare,
    RustTarget,
    ServiceName,
    SshOption,
)
from fdl_tasks.rules import CUDA_TAG_FIELD, CUDA_VERSION_FIELD, Cuda, split_ssh_option

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ARCH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MACHINE = re.compile(r"[a-z0-9][a-z0-9_]*")
_TARGET = re.compile(r"[a-z0-9_]+(?:-[a-z0-9_.]+){2,3}")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: Variables flodl's launcher sets per rank; fdl-cli refuses them in a cluster's ``env``.
LAUNCHER_OWNED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "FLODL_HOST_NAME",
        "FDL_ENV",
    }
)
LAUNCHER_OWNED_PREFIX = "FLODL_INTERNAL_"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: How much of a bad value a message quotes.
QUOTE_LIMIT = 60


class InvalidValue(ValueError):
    """A value of the right shape but not acceptable; its text is shown as is."""


def cut(text: str) -> str:
    """``text`` cut to :data:`QUOTE_LIMIT` characters, so a message stays one short line."""
    return text if len(text) <= QUOTE_LIMIT else f"{text[: QUOTE_LIMIT - 5]}…{text[-4:]}"


def quote(value: object) -> str:
    """``repr(value)``, cut: how every message shows a bad value."""
    return cut(repr(value))


def check_text(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {kind_of(value)}")
    if _CONTROL.search(value):
        raise InvalidValue(f"{quote(value)} contains a control character")
    return value


def kind_of(value: object) -> str:
    if value is None:
        return "nothing (null)"
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return f"{names.get(type(value), type(value).__name__)} ({quote(value)})"


def check_label(value: object) -> HostLabel:
    """A host label is a path segment: letters, digits, ``.``, ``_``, ``-``."""
    text = check_text(value)
    if not _LABEL.fullmatch(text):
        raise InvalidValue(
            f"host label {quote(text)} must start with a letter or digit and hold only "
            "letters, digits, '.', '_' and '-' (it becomes a directory name)"
        )
    return text


def check_arch(value: object) -> Arch:
    """An arch is a relative path under ``libtorch/`` that cannot escape it."""
    text = check_text(value)
    segments = text.split("/")
    if text.startswith("/") or not all(_ARCH_SEGMENT.fullmatch(s) for s in segments):
        raise InvalidValue(
            f"arch {quote(text)} must be a relative path under libtorch/ such as "
            "'precompiled/cu128' or 'builds/sm61-sm120' (no '..', no empty or "
            "absolute segments)"
        )
    return text


def check_abs_path(value: object) -> AbsPath:
    """Paths are absolute: each host's view of a mount, never relative to a cwd."""
    text = check_text(value)
    if not text:
        raise InvalidValue("expected a non-empty absolute path")
    if not text.startswith("/"):
        raise InvalidValue(f"expected an absolute path, got {quote(text)}")
    return text


def check_image(value: object) -> str:
    """An image name, whose only template fields are ``{cuda_version}`` and ``{cuda_tag}``."""
    text = check_text(value)
    bare = text.replace(CUDA_VERSION_FIELD, "").replace(CUDA_TAG_FIELD, "")
    if not text or text.startswith("-") or any(c in bare for c in "{} \t"):
        raise InvalidValue(
            f"image {quote(text)} must be an image name such as 'flodl-cuda:{{cuda_tag}}': no "
            "spaces, no leading '-', and no template fields but {cuda_version} and {cuda_tag}"
        )
    return text


def check_cuda_release(value: object) -> CudaRelease:
    text = check_text(value)
    if Cuda.parse(text) is None:
        raise InvalidValue(f"CUDA version {quote(text)} must look like '12.8' or '12.6.3'")
    return text


def check_mount_path(value: object) -> str:
    """Docker's ``-v SOURCE:TARGET`` syntax cannot carry a ``:`` or ``,`` in a path."""
    text = check_abs_path(value)
    if ":" in text or "," in text:
        raise InvalidValue(
            f"{quote(text)} cannot be bind-mounted by Docker (it contains ':' or ',')"
        )
    return text


def check_env_name(value: object) -> EnvName:
    text = check_text(value)
    if not _ENV_NAME.fullmatch(text):
        raise InvalidValue(f"{quote(text)} is not a valid environment variable name")
    return text


def check_launch_env_name(value: object) -> LaunchEnvName:
    """A cluster or worker ``env`` key; the ones flodl's launcher sets per rank are refused."""
    text = check_env_name(value)
    if text in LAUNCHER_OWNED or text.startswith(LAUNCHER_OWNED_PREFIX):
        raise InvalidValue(
            f"{quote(text)} is reserved (the launcher sets it for each rank) and cannot be "
            "set through env"
        )
    return text


def check_service(value: object) -> ServiceName:
    text = check_text(value)
    if not _SERVICE.fullmatch(text):
        raise InvalidValue(
            f"compose service {quote(text)} must be a service name of the project's "
            "docker compose file, such as 'cuda'"
        )
    return text


def check_ram_share(value: object) -> RamShare:
    """flodl's ``gpu_ram_share``: a share of host RAM (above 1 is allowed), finite, >= 0."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidValue(f"expected a number, got {kind_of(value)}")
    if not math.isfinite(value) or value < 0:
        raise InvalidValue(
            f"must be a non-negative fraction of host RAM (e.g. 0.5), got {quote(value)}"
        )
    return float(value)


def check_cpu_arch(value: object) -> CpuArch:
    text = check_text(value)
    if not _MACHINE.fullmatch(text):
        raise InvalidValue(
            f"CPU architecture {quote(text)} must be a name as 'uname -m' prints it, "
            "such as 'x86_64' or 'aarch64'"
        )
    return text


def check_rust_target(value: object) -> RustTarget:
    text = check_text(value)
    if not _TARGET.fullmatch(text):
        raise InvalidValue(
            f"Rust target {quote(text)} must be a target triple such as 'aarch64-unknown-linux-gnu'"
        )
    return text


def check_program(value: object) -> Program:
    """A linker or compiler: a command name or an absolute path, one word."""
    text = check_text(value)
    if not text or text.startswith("-") or any(c.isspace() for c in text):
        raise InvalidValue(
            f"program {quote(text)} must be one word, a command name or an absolute path "
            "(e.g. 'aarch64-linux-gnu-gcc')"
        )
    return text


def check_env_value(value: object) -> EnvValue:
    """YAML turns ``1`` into an integer; an env value is text, so numbers are kept as text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return EnvValue(str(value))
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string or a number, got {kind_of(value)}")
    if "\x00" in value:
        raise InvalidValue("an environment value cannot contain a NUL byte")
    return value


def check_port(value: object) -> Port:
    port = check_int(value)
    if not 0 < port < 65536:
        raise InvalidValue(f"expected a TCP port from 1 to 65535, got {port}")
    return port


def check_ssh_option(value: object) -> SshOption:
    """ssh_config style: ``Key=Value`` or ``Key Value``, as after ``ssh -o``."""
    text = check_text(value)
    if split_ssh_option(text) is None:
        raise InvalidValue(
            f"ssh option {quote(text)} must look like 'Key=Value' (e.g. 'ProxyJump=bastion')"
        )
    return text


def check_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValue(f"expected an integer, got {kind_of(value)}")
    return value


# --------------------------------------------------------------- fdl settings

#: A positive number of seconds; text (from a command line) is accepted.
Seconds = Annotated[float, "Seconds"]
#: A whole number, 0 or more; text is accepted.
Count = Annotated[int, "Count"]
#: A switch: a boolean, or 1/0, true/false, yes/no as text (Invoke's casting).
Switch = Annotated[bool, "Switch"]
#: sccache's size bound: a number with an optional K, M, G or T.
CacheSize = Annotated[str, "CacheSize"]
_SWITCH_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _number(value: object) -> float | None:
    """A number, or text that is one (Invoke passes untyped options as text)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def check_seconds(value: object) -> Seconds:
    seconds = _number(value)
    if seconds is None or not 0 < seconds < math.inf:
        raise InvalidValue(f"must be a positive number of seconds, got {quote(value)}")
    return seconds


def check_count(value: object) -> Count:
    count = _number(value)
    if count is None or count < 0 or not count.is_integer():
        raise InvalidValue(f"must be int (a whole number, 0 or more), got {quote(value)}")
    return int(count)


def check_switch(value: object) -> Switch:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _SWITCH_WORDS:
        return _SWITCH_WORDS[value.lower()]
    raise InvalidValue(f"must be bool (true or false, yes or no, 1 or 0), got {quote(value)}")


def check_cache_size(value: object) -> CacheSize:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.fullmatch(r"[1-9][0-9]*[KMGT]?", text):
        raise InvalidValue(f"must be a size such as '10G' or '500M', got {quote(value)}")
    return text
