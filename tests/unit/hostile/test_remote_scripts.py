"""The scripts sent to each host: the preflight probe and the delivery verification.

A hostile data path or binary path must be tested, hashed and ldd'ed as
exactly one word, and nothing else may run.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from fdl_tasks.preflight.probe import ProbeRequest, parse_facts
from fdl_tasks.publish.envelope import PerHostEnvelope
from fdl_tasks.publish.verification import parse_verification, verification_script
from tests.unit.hostile.conftest import (
    checked_command,
    checked_crate_dir,
    commands,
    crate_dirs,
    good_arches,
    host_binary,
    label_segment,
    load,
    mostly,
    one_worker,
    printable,
    sandbox,
)

#: The recorders' getconf names no glibc, so ldd's banner is read as on a musl host.
PROBE_ABI_CALLS = [
    ("getconf", ("GNU_LIBC_VERSION",)),
    ("head", ("-n", "2")),
    ("ldd", ("--version",)),
    ("tr", ("\\n", " ")),
    ("uname", ("-m",)),
]


@settings(max_examples=60, deadline=None)
@given(suffix=printable, declared=st.booleans(), abi=st.booleans(), exists=st.booleans())
def test_probe_script_tests_the_hostile_data_path_and_runs_nothing_else(
    recorders: Path, suffix: str, declared: bool, abi: bool, exists: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {"controller": {"path": "/p"}, "workers": [one_worker("/w", data_path=path)]},
            "workers[0].data_path",
        )
        if cluster is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        if exists:
            os.makedirs(path, exist_ok=True)
        elif os.path.lexists(os.path.realpath(path)):
            return  # suffix resolved to the root itself or to an existing directory
        request = ProbeRequest(cluster.workers[0].data_path or "", declared, abi)
        calls, stdout = box.run(request.script())
        facts = parse_facts(stdout)
        assert facts is not None, stdout
        assert facts.data == ("ok" if exists else "missing"), stdout
        assert sorted((c.name, c.argv) for c in calls) == (PROBE_ABI_CALLS if abi else [])
        if abi:
            assert facts.pkill is False


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    label=mostly(label_segment),
    arch=mostly(good_arches),
    command=mostly(commands),
    crate=mostly(crate_dirs),
    present=st.booleans(),
)
def test_verification_script_hashes_and_ldds_exactly_the_hostile_binary_path(
    recorders: Path, suffix: str, label: str, arch: str, command: str, crate: str, present: bool
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {"controller": {"path": "/p"}, "workers": [one_worker(path, label, arch)]},
            "workers[0].",
        )
        name, crate_dir = checked_command(command), checked_crate_dir(crate)
        if cluster is None or name is None or crate_dir is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        worker = cluster.workers[0]
        entry = PerHostEnvelope.for_worker(worker, name, crate_dir)
        binary = host_binary(path, label, arch, name)
        if present:
            os.makedirs(os.path.dirname(binary), exist_ok=True)
            Path(binary).write_bytes(b"\x7fELF")
        calls, stdout = box.run(verification_script(worker.path, entry))
        names = sorted(c.name for c in calls)
        reads = ["cut", "sha256sum", "od", "tr"] * present
        assert names == sorted([*reads, "getconf", "head", "ldd", "ldd", "sed", "tr", "uname"])
        if present:
            (hashed,) = [c for c in calls if c.name == "sha256sum"]
            assert hashed.argv == (binary,)
            (header,) = [c for c in calls if c.name == "od"]
            assert header.argv == ("-An", "-tu1", "-N20", binary)
        lddeds = {c.argv: c.ld_library_path for c in calls if c.name == "ldd"}
        assert lddeds == {(binary,): entry.ld_library_path, ("--version",): None}
        copy = parse_verification(stdout)
        assert copy is not None and (copy.sha256 is None) == (not present), stdout


@settings(max_examples=60, deadline=None)
@given(
    suffix=printable,
    arch=mostly(good_arches),
    names=st.lists(st.sampled_from(["libtorch.so", "libc10.so", "libx.so.1", "notlib.so"])),
)
def test_probe_ldds_each_variant_library_of_the_hostile_path_and_nothing_else(
    recorders: Path, suffix: str, arch: str, names: list[str]
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        cluster = load(
            {"controller": {"path": "/p"}, "workers": [one_worker(path, arch=arch)]}, "workers[0]."
        )
        if cluster is None:
            reject()  # refused cleanly (checked): draw an example that reaches the shell
        worker = cluster.workers[0]
        lib = f"{worker.path.rstrip('/')}/libtorch/{worker.arch}/lib"
        real = os.path.realpath(worker.path)
        if os.path.lexists(real) and not os.path.isdir(real):
            return  # suffix resolved to a file of the sandbox (box.path never leaves it)
        os.makedirs(lib, exist_ok=True)
        for name in names:
            Path(lib, name).write_bytes(b"\x7fELF")
        request = attrs.evolve(ProbeRequest.for_host(worker, abi=True), paths=None)
        calls, stdout = box.run(request.script())
        assert parse_facts(stdout) is not None, stdout
        lddeds = [(c.argv, c.ld_library_path) for c in calls if c.name == "ldd"]
        library_path = PerHostEnvelope.for_worker(worker, "x", "").ld_library_path
        expected = [((f"{lib}/{n}",), library_path) for n in sorted(set(names)) if n != "libx.so.1"]
        expected = [e for e in expected if not e[0][0].endswith("/notlib.so")]
        assert sorted(lddeds) == sorted([(("--version",), None), *expected])
        others = sorted(c.name for c in calls if c.name != "ldd")
        nccl = ["ldconfig", "sed"] if request.nccl else []  # an NVIDIA variant: no file, no header
        assert others == sorted(["getconf", "head", "tr", "uname", *["sed"] * len(expected), *nccl])


@settings(max_examples=40, deadline=None)
@given(suffix=printable)
def test_probe_reads_nccl_under_the_hostile_path_and_nothing_else(
    recorders: Path, suffix: str
) -> None:
    with sandbox(recorders) as box:
        path = box.path(suffix)
        arch = "precompiled/cu128"
        cluster = load(
            {"controller": {"path": "/p"}, "workers": [one_worker(path, arch=arch)]}, "workers[0]."
        )
        if cluster is None:
            reject()
        worker = cluster.workers[0]
        variant = f"{worker.path.rstrip('/')}/libtorch/{arch}"
        real = os.path.realpath(worker.path)
        if os.path.lexists(real) and not os.path.isdir(real):
            return  # suffix resolved to a file of the sandbox (box.path never leaves it)
        os.makedirs(f"{variant}/lib", exist_ok=True)
        os.makedirs(f"{variant}/include", exist_ok=True)
        Path(variant, "lib", "libnccl.so.2.21.5").touch()
        Path(variant, "include", "nccl.h").write_text("#define NCCL_MAJOR 2\n")
        request = attrs.evolve(ProbeRequest.for_host(worker, abi=True), paths=None, variant=None)
        calls, stdout = box.run(request.script())
        facts = parse_facts(stdout)
        assert facts is not None and str(facts.nccl) == "2.21.5", stdout
        asked = {c.name: c.argv for c in calls if c.name in ("readlink", "grep", "ldconfig")}
        assert asked["readlink"] == ("-f", f"{variant}/lib/libnccl.so.2.21.5")
        assert asked["grep"][0] == "-E" and asked["grep"][2:] == (f"{variant}/include/nccl.h",)
        assert asked["ldconfig"] == ("-p",)
        others = sorted(c.name for c in calls if c.name not in asked)
        assert others == sorted(["getconf", "head", "tr", "uname", "ldd", "sed", "sed"])
