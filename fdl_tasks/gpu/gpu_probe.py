"""The GPU part of the preflight probe: shell lines asking the GPU tools, their answers.

Pure logic. The lines ride in the probe's one ssh round trip
(:mod:`fdl_tasks.preflight.probe`); each answer is a ``key=value`` line, and a host
without the tools answers only ``gpu_tools=`` (nothing found).
"""

from __future__ import annotations

from typing import Protocol

from fdl_tasks.gpu.gpus import GpuReport, parse_kfd, parse_nvidia_smi, parse_rocminfo

_QUERY = "--format=csv,noheader"
#: KFD's topology: one ``properties`` file per node, GPUs with a nonzero gfx_target_version.
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"

#: How long one GPU tool may take: a wedged driver can hang nvidia-smi, and the
#: probe's other answers must still arrive within the probe's budget (``fdl.probe_timeout``,
#: 20 s by default): at most three tool calls (a hung query is not asked again) stay under it.
TOOL_SECONDS = 5

#: POSIX sh, always exit 0. nvidia-smi: the four fields, else (a driver older than
#: ``compute_cap``, about 510) the three others; rocminfo: each agent's fields at the
#: agents' two-space indent (ISA names are indented deeper); no rocminfo: KFD's topology.
#: Each tool runs under timeout(1) where the host has it; a query that timed out (124)
#: is not asked again in the older form.
GPU_FACT_LINES = (
    "t=''",
    f"if command -v timeout >/dev/null 2>&1; then w='timeout {TOOL_SECONDS}'; else w=''; fi",
    'if command -v nvidia-smi >/dev/null 2>&1; then t="$t nvidia-smi"; '
    f"q=$($w nvidia-smi --query-gpu=index,name,compute_cap,driver_version {_QUERY} 2>/dev/null)"
    "; s=$?; if [ \"$s\" -eq 0 ]; then printf '%s\\n' \"$q\" | sed 's/^/nvidia=/'; "
    f'elif [ "$s" -ne 124 ]; then $w nvidia-smi --query-gpu=index,name,driver_version {_QUERY} '
    "2>/dev/null | sed 's/^/nvidia_nocap=/'; fi; fi",
    'if command -v rocminfo >/dev/null 2>&1; then t="$t rocminfo"; $w rocminfo 2>/dev/null '
    "| sed -n -E 's/^  (Name|Marketing Name|Device Type):[[:space:]]*(.*)$/rocm=\\1:\\2/p'; "
    f'elif [ -d {KFD_NODES} ]; then t="$t kfd"; for p in {KFD_NODES}/*/properties; do '
    '[ -r "$p" ] && n=${p%/properties} && printf \'kfd=%s:%s\\n\' "${n##*/}" '
    '"$(sed -n \'s/^gfx_target_version[[:space:]]*//p\' "$p")"; done; fi',
    "printf 'gpu_tools=%s\\n' \"$t\"",
)


class Answers(Protocol):
    """A host's ``key=value`` answers (:class:`fdl_tasks.preflight.probe.Answers`)."""

    def get(self, key: str) -> str | None: ...

    def every(self, key: str) -> tuple[str, ...]: ...


def gpu_report(answers: Answers) -> GpuReport | None:
    """The GPUs a host listed; ``None`` when the probe asked nothing about GPUs."""
    tools = answers.get("gpu_tools")
    if tools is None:
        return None
    nvidia = parse_nvidia_smi(answers.every("nvidia")) + parse_nvidia_smi(
        answers.every("nvidia_nocap"), with_capability=False
    )
    rocm = [line.replace(":", ": ", 1) for line in answers.every("rocm")]
    amd = parse_rocminfo(rocm) or parse_kfd(answers.every("kfd"))
    return GpuReport(tuple(tools.split()), nvidia + amd)
