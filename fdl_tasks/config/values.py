"""Single-value rules for cluster.yaml: each kind of :mod:`fdl_tasks.config.model` has a check.

Pure. A check returns the value (maybe normalised) or raises :class:`InvalidValue`
quoting it cut short (a bad 10 kB value still makes one line); every rule is here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from fdl_tasks.config.model import (
    AbsPath,
    Arch,
    CargoFeature,
    CpuArch,
    CudaRelease,
    DeliveryMode,
    EnvName,
    EnvValue,
    GpuVendorName,
    HostLabel,
    ImageTemplate,
    LaunchEnvName,
    MountPath,
    Port,
    Program,
    RamShare,
    RustTarget,
    ServiceName,
    SshOption,
    WireText,
)
from fdl_tasks.config.names import split_ssh_option
from fdl_tasks.config.variants import CUDA_TAG_FIELD, CUDA_VERSION_FIELD, Cuda
from fdl_tasks.core.errors import passed

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ARCH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MACHINE = re.compile(r"[a-z0-9][a-z0-9_]*")
_TARGET = re.compile(r"[a-z0-9_]+(?:-[a-z0-9_.]+){2,3}")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MOUNTABLE = re.compile(r"[^:,]*")  # a path Docker's -v syntax can carry
_FEATURE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_][A-Za-z0-9_+-]*)?")
#: Variables flodl's launcher sets per rank; fdl-cli refuses them in a cluster's ``env``.
LAUNCHER_OWNED = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
    | {"GPU_DEVICE_ORDINAL", "FLODL_HOST_NAME", "FDL_ENV"}
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


def check_wire_text(value: object) -> WireText:
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {kind_of(value)}")
    return value


def check_text(value: object) -> str:
    if _CONTROL.search(value := check_wire_text(value)):
        raise InvalidValue(f"{quote(value)} contains a control character")
    return value


def kind_of(value: object) -> str:
    if value is None:
        return "nothing (null)"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "a mapping"}
    return f"{names.get(type(value), type(value).__name__)} ({quote(value)})"


def passing(value: object, test: Callable[[str], object], what: str, rule: str) -> str:
    """Text that passes ``test``; else ``<what> '<value>' <rule>``."""
    text = check_text(value)
    return passed(
        text, test, lambda: InvalidValue(" ".join(filter(None, (what, quote(text), rule))))
    )


def matching(value: object, pattern: re.Pattern[str], what: str, rule: str) -> str:
    """Text that ``pattern`` matches whole; else ``<what> '<value>' <rule>``."""
    return passing(value, pattern.fullmatch, what, rule)


def check_label(value: object) -> HostLabel:
    """A host label is a path segment: letters, digits, ``.``, ``_``, ``-``."""
    rule = (
        "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
        "(it becomes a directory name)"
    )
    return matching(value, _LABEL, "host label", rule)


def check_arch(value: object) -> Arch:
    """An arch is a relative path under ``libtorch/`` that cannot escape it."""
    return passing(
        value,
        lambda text: all(_ARCH_SEGMENT.fullmatch(s) for s in text.split("/")),
        "arch",
        "must be a relative path under libtorch/ such as 'precompiled/cu128' or "
        "'builds/sm61-sm120' (no '..', no empty or absolute segments)",
    )


def check_abs_path(value: object) -> AbsPath:
    """Paths are absolute: each host's view of a mount, never relative to a cwd."""
    text = check_text(value)
    if not text:
        raise InvalidValue("expected a non-empty absolute path")
    if not text.startswith("/"):
        raise InvalidValue(f"expected an absolute path, got {quote(text)}")
    return text


def _is_image(text: str) -> bool:
    bare = text.replace(CUDA_VERSION_FIELD, "").replace(CUDA_TAG_FIELD, "")
    return bool(text) and not text.startswith("-") and not any(c in bare for c in "{} \t")


def _is_word(text: str) -> bool:
    """One word that is not an option: not empty, no ``-`` first, no white space."""
    return bool(text) and not text.startswith("-") and not any(c.isspace() for c in text)


#: What :func:`check_image` says of a bad image name.
IMAGE_RULE = (
    "must be an image name such as 'flodl-cuda:{cuda_tag}': no spaces, no leading '-', "
    "and no template fields but {cuda_version} and {cuda_tag}"
)


def check_image(value: object) -> str:
    """An image name, whose only template fields are ``{cuda_version}`` and ``{cuda_tag}``."""
    return passing(value, _is_image, "image", IMAGE_RULE)


def check_cuda_release(value: object) -> CudaRelease:
    return passing(value, Cuda.parse, "CUDA version", "must look like '12.8' or '12.6.3'")


def check_mount_path(value: object) -> str:
    """Docker's ``-v SOURCE:TARGET`` syntax cannot carry a ``:`` or ``,`` in a path."""
    rule = "cannot be bind-mounted by Docker (it contains ':' or ',')"
    return matching(check_abs_path(value), _MOUNTABLE, "", rule)


def check_env_name(value: object) -> EnvName:
    return matching(value, _ENV_NAME, "", "is not a valid environment variable name")


def check_launch_env_name(value: object) -> LaunchEnvName:
    """A cluster or worker ``env`` key; the ones flodl's launcher sets per rank are refused."""
    return passing(
        check_env_name(value),
        lambda text: text not in LAUNCHER_OWNED and not text.startswith(LAUNCHER_OWNED_PREFIX),
        "",
        "is reserved (the launcher sets it for each rank) and cannot be set through env",
    )


def check_service(value: object) -> ServiceName:
    rule = "must be a service name of the project's docker compose file, such as 'cuda'"
    return matching(value, _SERVICE, "compose service", rule)


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
    rule = "must be a name as 'uname -m' prints it, such as 'x86_64' or 'aarch64'"
    return matching(value, _MACHINE, "CPU architecture", rule)


def check_rust_target(value: object) -> RustTarget:
    rule = "must be a target triple such as 'aarch64-unknown-linux-gnu'"
    return matching(value, _TARGET, "Rust target", rule)


def check_program(value: object) -> Program:
    """A linker or compiler: a command name or an absolute path, one word."""
    rule = "must be one word, a command name or an absolute path (e.g. 'aarch64-linux-gnu-gcc')"
    return passing(value, _is_word, "program", rule)


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
    rule = "must look like 'Key=Value' (e.g. 'ProxyJump=bastion')"
    return passing(value, split_ssh_option, "ssh option", rule)


def check_feature(value: object) -> CargoFeature:
    """A cargo feature (``cuda``, ``rocm``, ``dep/feat``): one word for ``--features``."""
    return matching(value, _FEATURE, "cargo feature", "is not a feature name such as 'rocm'")


def check_gpu_vendor(value: object) -> GpuVendorName:
    """A key of ``controller.gpu_builds``: the GPU vendors flodl builds for."""
    rule = "must be 'nvidia' or 'amd'"
    return passing(value, ("nvidia", "amd").__contains__, "GPU vendor", rule)


def check_delivery_mode(value: object) -> DeliveryMode:
    if value not in ("shared", "copy"):
        raise InvalidValue(
            f"must be 'shared' (the host sees the project) or 'copy' (the binary is "
            f"uploaded to it), got {quote(value)}"
        )
    return str(value)


def check_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValue(f"expected an integer, got {kind_of(value)}")
    return value


#: The check of each kind of value, for the converter.
CHECKS: dict[Any, Callable[[object], object]] = {
    HostLabel: check_label,
    Arch: check_arch,
    AbsPath: check_abs_path,
    EnvName: check_env_name,
    EnvValue: check_env_value,
    LaunchEnvName: check_launch_env_name,
    ServiceName: check_service,
    CudaRelease: check_cuda_release,
    RamShare: check_ram_share,
    Port: check_port,
    SshOption: check_ssh_option,
    ImageTemplate: check_image,
    MountPath: check_mount_path,
    CpuArch: check_cpu_arch,
    RustTarget: check_rust_target,
    Program: check_program,
    CargoFeature: check_feature,
    GpuVendorName: check_gpu_vendor,
    DeliveryMode: check_delivery_mode,
    WireText: check_wire_text,
}
