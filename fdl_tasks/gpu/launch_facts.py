"""Facts flodl's launcher acts on that preflight can judge before any build.

Pure logic; :mod:`fdl_tasks.preflight.preflight` resolves the names and
:mod:`fdl_tasks.preflight.gpu_gate` brings each host's GPUs.

- ``controller.host`` is the rendezvous address flodl ships to every rank. A
  name that resolves on the controller only to loopback (Debian maps the
  hostname to ``127.0.1.1``) sends the ranks of other machines to themselves.
- ``local_devices: all`` is counted by flodl's launcher at launch, NVIDIA GPUs
  with ``nvidia-smi`` and AMD ones through KFD; zero is a hard error there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from fdl_tasks.gpu.gpus import VENDOR_NAMES, GpuReport, Vendor


def literal_address(host: str) -> str | None:
    """``host`` itself when it is a literal IP address (judged without resolving)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def only_loopback(addresses: Sequence[str] | None) -> bool:
    """Some addresses, every one loopback (``127.0.0.0/8``, ``::1``, ``::ffff:127.x``)."""
    if not addresses:
        return False
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        if not (mapped or ip).is_loopback:
            return False
    return True


def loopback_warning(
    host: str,
    addresses: Sequence[str] | None,
    targets: Iterable[tuple[str, str, Sequence[str] | None]],
) -> str | None:
    """The warning when ``controller.host`` (resolved to ``addresses``; ``None``: it did
    not resolve, which flodl warns about itself) is loopback only while a remote worker's
    ssh target is not. ``targets``: (label, ssh target, its addresses) of each remote
    worker that dials ``controller.host``; a target that did not resolve is not loopback.
    Read lazily: the first target off loopback ends it."""
    if not only_loopback(addresses):
        return None
    assert addresses is not None
    for label, target, resolved in targets:
        if only_loopback(resolved):
            continue
        said = "" if literal_address(host) else " resolves on the controller only to loopback"
        shown = ", ".join(dict.fromkeys(addresses))
        return (
            f"controller.host {host}{said} ({shown}), but worker {label} is reached at "
            f"{target}, not a loopback address: flodl gives every rank {host} to dial, so the "
            "ranks on other machines would dial themselves; set controller.host to an address "
            "of this machine that the workers reach"
        )
    return None


def all_devices_error(local_devices: object, vendor: Vendor, gpus: GpuReport) -> str | None:
    """The error for ``local_devices: all`` on a host where flodl's launcher would count
    no device: no GPU of the variant's vendor (a CPU-only variant: no GPU at all, as
    flodl counts both vendors)."""
    if local_devices != "all":
        return None
    if any(vendor == "cpu" or g.vendor == vendor for g in gpus.gpus):
        return None
    wanted = "GPU" if vendor == "cpu" else f"{VENDOR_NAMES[vendor]} GPU"
    if gpus.tools:
        found = f"{', '.join(gpus.tools)} listed no {wanted}"
    else:
        found = "no GPU tool answered over ssh: nvidia-smi, rocminfo, KFD's topology"
    return (
        f"local_devices: all, but this host has no {wanted} ({found}): flodl's launcher "
        "counts 0 devices here and refuses to launch; list the devices instead "
        "(e.g. local_devices: [0])"
    )
