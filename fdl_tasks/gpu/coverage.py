"""GPU coverage verdicts: does a libtorch variant run on a host's GPUs and driver?

Pure logic over flodl's ``.arch`` file (``torch=``, ``cuda=``, ``archs=``,
``source=`` lines) and the GPUs the probe found (:mod:`fdl_tasks.gpu.gpus`).
"""

from __future__ import annotations

import re

import attrs

from fdl_tasks.gpu.gpus import VENDOR_NAMES, Gpu, GpuReport, Vendor, cuda_release, named_cuda

#: The oldest Linux driver each CUDA major release runs on, with CUDA's minor version
#: compatibility. Source: NVIDIA, "CUDA Compatibility" (docs.nvidia.com/deploy/
#: cuda-compatibility), table "CUDA Toolkit and Minimum Required Driver Version for
#: CUDA Minor Version Compatibility": CUDA 11.x >= 450.80.02, 12.x >= 525.60.13,
#: 13.x >= 580.
CUDA_MIN_DRIVER: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}

_CAPABILITY = re.compile(r"(?:sm_|compute_)?(\d+)\.?(\d)([af])?(\+ptx)?", re.IGNORECASE)


@attrs.frozen
class ArchFile:
    """A variant's ``.arch``; ``archs`` tokenised on whitespace (and ``;``/``,``)."""

    torch: str | None = None
    cuda: str | None = None
    archs: tuple[str, ...] | None = None
    source: str | None = None


def parse_arch_file(text: str) -> ArchFile:
    """Unknown lines are ignored, as flodl does; a key given twice keeps its last value."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals and key.strip() in ("torch", "cuda", "archs", "source"):
            values[key.strip()] = value.strip()
    archs = values.get("archs")
    return ArchFile(
        torch=values.get("torch") or None,
        cuda=values.get("cuda") or None,
        archs=tuple(re.split(r"[\s;,]+", archs.strip())) if archs and archs.strip() else None,
        source=values.get("source") or None,
    )


def capability(token: str) -> tuple[int, int, bool, bool] | None:
    """``8.6`` / ``86`` / ``sm_86`` → (8, 6, False, False); ``8.6+PTX`` / ``compute_86`` →
    (8, 6, True, False): PTX, which the driver compiles for the GPU it runs on;
    ``9.0a`` / ``sm_90a`` → (9, 0, False, True): arch-specific code, for exactly 9.0
    (``f``, family-specific, counts as plain code of its major)."""
    match = _CAPABILITY.fullmatch(token)
    if not match:
        return None
    ptx = bool(match.group(4)) or token.lower().startswith("compute_")
    exact = (match.group(3) or "").lower() == "a"
    return int(match.group(1)), int(match.group(2)), ptx, exact


def nvidia_covered(cap: str, archs: tuple[str, ...]) -> bool:
    """NVIDIA's binary compatibility: code for X.y runs on X.z for z >= y (a stock build
    listing 6.0 covers a 6.1 Pascal), never across majors; a PTX entry for X.y is
    compiled by the driver for any GPU of capability >= X.y, so it covers those too."""
    gpu = capability(cap)
    if gpu is None:
        return False
    for token in archs:
        built = capability(token)
        if built is None:
            continue
        major, minor, ptx, exact = built
        if exact:
            if (major, minor) == gpu[:2]:
                return True
        elif (major, minor) <= gpu[:2] and (ptx or major == gpu[0]):
            return True
    return False


def amd_covered(target: str, archs: tuple[str, ...]) -> bool:
    """gfx code objects run only on their own target (``gfx90a:xnack-`` counts as
    ``gfx90a``): no compatibility across targets."""
    base = target.split(":", 1)[0].lower()
    return any(token.split(":", 1)[0].lower() == base for token in archs)


def variant_cuda(arch: str, info: ArchFile | None) -> tuple[int, int] | None:
    """The variant's CUDA release: ``.arch``'s ``cuda=``, else a ``cuNNN`` basename."""
    if info and info.cuda:
        release = cuda_release(info.cuda)
        return (int(release[0]), int(release[1])) if release else None
    return named_cuda(arch)


def driver_version(text: str | None) -> tuple[int, ...] | None:
    if not text or not re.fullmatch(r"\d+(?:\.\d+)*", text):
        return None
    return tuple(int(part) for part in text.split("."))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def driver_supports(driver: str | None, cuda: tuple[int, int]) -> bool | None:
    """``None`` when the driver or the CUDA major is unknown to the table."""
    version, needed = driver_version(driver), CUDA_MIN_DRIVER.get(cuda[0])
    if version is None or needed is None:
        return None
    return version >= needed


@attrs.frozen
class Coverage:
    """A host's GPU verdict: ``state`` ``ok``, ``refused``, ``unknown`` or ``none``
    (no GPU tool answered, or a CPU variant); one line per problem."""

    state: str
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: What could not be checked: said, but it changes no verdict.
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            **{k: list(v) for k, v in attrs.asdict(self).items() if k != "state"},
        }


def _ways_out(arch: str, target: str) -> str:
    return (
        f"give the host another variant that covers {target} (its 'arch', or 'arch: auto'), "
        f"or a libtorch built for {target} (e.g. fdl libtorch build)"
    )


def _uncovered(gpu: Gpu, arch: str, archs: tuple[str, ...]) -> str:
    kind = "compute capability" if gpu.vendor == "nvidia" else "target"
    return (
        f"GPU {gpu.index} ({gpu.name}, {kind} {gpu.target}) is not covered by variant "
        f"{arch}, which covers archs={' '.join(archs)}: {_ways_out(arch, str(gpu.target))}"
    )


def _driver_problem(gpu: Gpu, arch: str, cuda: tuple[int, int]) -> str:
    needed = _dotted(CUDA_MIN_DRIVER[cuda[0]])
    return (
        f"GPU {gpu.index} ({gpu.name}): driver {gpu.driver} is older than variant {arch}'s "
        f"CUDA {cuda[0]}.{cuda[1]} needs (>= {needed}, NVIDIA's CUDA compatibility table): "
        "update the driver, or give the host a variant built for an older CUDA"
    )


def judge_coverage(
    arch: str, vendor: Vendor, report: GpuReport | None, info: ArchFile | None
) -> Coverage:
    """Every GPU covered by ``archs=`` and, on NVIDIA, its driver new enough for the
    variant's CUDA. Unknown facts (no tool, no ``.arch``, no capability) never refuse."""
    gpus = report.gpus if report else ()
    warnings: list[str] = []
    if len(report.vendors if report else ()) > 1:
        warnings.append(
            "mixed-vendor host: it has "
            + " and ".join(VENDOR_NAMES[v] for v in sorted(report.vendors if report else ()))
            + f" GPUs; variant {arch} is {VENDOR_NAMES[vendor]}, the others will not be used"
        )
    if vendor == "cpu":
        if gpus:
            warnings.append(
                f"a CPU-only variant ({arch}) on a host with {len(gpus)} GPU(s) "
                f"({', '.join(g.name for g in gpus)}): they will not be used"
            )
        return Coverage("none", (), tuple(warnings))
    if report is None or not report.tools:
        tools = "nvidia-smi" if vendor == "nvidia" else "rocminfo nor /sys/class/kfd"
        note = f"GPU coverage could not be checked: no {tools} on the host"
        return Coverage("unknown", (), tuple(warnings), (note,))
    own = [g for g in gpus if g.vendor == vendor]
    if not own:
        warnings.append(f"no {VENDOR_NAMES[vendor]} GPU found for {VENDOR_NAMES[vendor]} {arch}")
        return Coverage("unknown", (), tuple(warnings))
    errors: list[str] = []
    cuda = variant_cuda(arch, info) if vendor == "nvidia" else None
    for gpu in own:
        if cuda and driver_supports(gpu.driver, cuda) is False:
            errors.append(_driver_problem(gpu, arch, cuda))
    if info is None or info.archs is None:
        note = f"variant {arch} has no .arch with an archs= line: GPU coverage unknown"
        return Coverage("refused" if errors else "unknown", tuple(errors), tuple(warnings), (note,))
    covered = nvidia_covered if vendor == "nvidia" else amd_covered
    unchecked = False
    for gpu in own:
        if gpu.target is None:
            unchecked = True
            what = "compute capability" if vendor == "nvidia" else "gfx target"
            warnings.append(
                f"GPU {gpu.index} ({gpu.name}): the driver does not report its {what} "
                "(an older driver?): its coverage could not be checked"
            )
        elif not covered(gpu.target, info.archs):
            errors.append(_uncovered(gpu, arch, info.archs))
    state = "refused" if errors else "unknown" if unchecked else "ok"
    return Coverage(state, tuple(errors), tuple(warnings))
