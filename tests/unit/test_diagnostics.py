"""Each diagnostic once, naming the builds that gave it."""

from __future__ import annotations

from fdl_tasks.build.diagnostics import Grouper, normalized, said

SYNTAX = ("error: expected expression, found `;`", "  --> src/main.rs:3:13")
OWN = {
    "cu128": ["target/cluster/precompiled-cu128-aa", "precompiled/cu128"],
    "cu126": ["target/cluster/precompiled-cu126-bb", "precompiled/cu126"],
    "cpu": ["target/cluster/precompiled-cpu-cc", "precompiled/cpu"],
}


def test_a_shared_error_is_said_once_when_every_build_gave_it() -> None:
    grouper = Grouper(["cu128", "cu126", "cpu"])
    assert grouper.add("cu128", SYNTAX, OWN["cu128"]) == []
    assert grouper.add("cpu", SYNTAX, OWN["cpu"]) == []
    assert grouper.add("cu126", SYNTAX, OWN["cu126"]) == [
        ["error in cu128, cu126, cpu: expected expression, found `;`", SYNTAX[1]]
    ]
    for build in OWN:
        assert grouper.finish(build) == []  # said once: nothing more at the end


def test_a_variant_only_error_waits_for_the_others_to_finish_without_it() -> None:
    grouper = Grouper(["cu128", "cu126", "cpu"])
    cuda = ("error[E0425]: cannot find function `cuda_init` in this scope",)
    assert grouper.add("cu128", cuda, OWN["cu128"]) == []
    assert grouper.add("cu126", cuda, OWN["cu126"]) == []
    assert grouper.finish("cu128") == []
    assert grouper.finish("cpu") == [
        ["error[E0425] in cu128, cu126: cannot find function `cuda_init` in this scope"]
    ]


def test_a_build_giving_a_text_twice_meets_another_giving_it_twice() -> None:
    grouper = Grouper(["a", "b"])
    warning = ("warning: unused variable: `x`",)
    assert grouper.add("a", warning, []) == []
    assert grouper.add("a", warning, []) == []
    assert grouper.add("b", warning, []) == [["warning in a, b: unused variable: `x`"]]
    assert grouper.add("b", warning, []) == [["warning in a, b: unused variable: `x`"]]


def test_each_builds_own_paths_and_cargos_hashes_are_set_aside() -> None:
    cu128 = [
        "error: failed to run custom build command for `torch-sys`",
        "  target/cluster/precompiled-cu128-aa/release/build/torch-sys-0123456789abcdef/x",
        "  libtorch/precompiled/cu128/lib has no libtorch.so",
    ]
    cpu = [
        line.replace("cu128-aa", "cpu-cc")
        .replace("0123456789abcdef", "fedcba9876543210")
        .replace("precompiled/cu128", "precompiled/cpu")
        for line in cu128
    ]
    assert normalized(cu128, OWN["cu128"]) == normalized(cpu, OWN["cpu"])
    assert normalized(cu128, OWN["cu128"]) != normalized(cu128[:1], OWN["cu128"])


def test_a_line_that_is_no_diagnostic_header_is_named_in_front() -> None:
    assert said(["cu128", "cpu"], ["Caused by:", "  x"]) == ["[cu128, cpu] Caused by:", "  x"]
