"""The compile cache's ``RUSTC_WRAPPER``: binary crates straight to rustc, the rest to sccache.

The script is run by a real ``sh``, with a fake sccache that records its calls
and a fake compiler that says it ran.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fdl_tasks.cache import compile_cache as cache_module
from fdl_tasks.cache.compile_cache import WRAPPER_SCRIPT, open_cache

Wrap = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def wrap(tmp_path: Path) -> Wrap:
    script = tmp_path / "sccache"
    script.write_text(WRAPPER_SCRIPT)
    script.chmod(0o755)
    fake = tmp_path / "real-sccache"
    fake.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path}/calls\necho "through sccache"\n')
    fake.chmod(0o755)
    compiler = tmp_path / "rustc"
    compiler.write_text('#!/bin/sh\necho "rustc $*"\n')
    compiler.chmod(0o755)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), str(compiler), *args],
            env={"PATH": os.environ["PATH"], "FDL_SCCACHE": str(fake)},
            capture_output=True,
            text=True,
            check=False,
        )

    return run


def test_a_binary_crate_goes_straight_to_rustc(wrap: Wrap, tmp_path: Path) -> None:
    """A command and a build script: sccache never caches what links, so it is never asked."""
    for crate in ("ddp_bench", "build_script_build"):
        done = wrap("--crate-name", crate, "--edition=2021", "--crate-type", "bin", "src/main.rs")
        assert done.returncode == 0 and done.stdout.startswith("rustc --crate-name"), done
    assert not (tmp_path / "calls").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("--crate-name", "serde", "--crate-type", "lib", "src/lib.rs"),
        ("--crate-name", "serde_derive", "--crate-type", "proc-macro", "src/lib.rs"),
        ("--crate-name", "bin", "src/lib.rs"),  # "bin" as a value, not a crate type
        ("-c", "shim.c", "-o", "shim.o"),  # cc-rs's C compiles through the same wrapper
        ("-vV",),
    ],
)
def test_everything_else_goes_through_sccache(
    wrap: Wrap, tmp_path: Path, args: tuple[str, ...]
) -> None:
    done = wrap(*args)
    assert done.returncode == 0 and done.stdout == "through sccache\n", done
    assert (tmp_path / "calls").read_text().split()[1:] == list(args)


def test_open_cache_writes_the_wrapper_beside_the_cache_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "find_sccache", lambda: "/opt/bin/sccache")
    cache = open_cache(str(tmp_path / "c"), "1G")
    assert cache is not None
    wrapper = tmp_path / "c-wrapper" / "sccache"
    assert cache.wrapper == str(wrapper) and not (tmp_path / "c" / "sccache").exists()
    assert wrapper.read_text() == WRAPPER_SCRIPT and os.access(wrapper, os.X_OK)
    written = wrapper.stat().st_ino
    open_cache(str(tmp_path / "c"), "1G")
    assert wrapper.stat().st_ino == written  # already there: not written again
    wrapper.write_text("#!/bin/sh\nexit 1\n")  # an older version's, or a broken one
    open_cache(str(tmp_path / "c"), "1G")
    assert wrapper.read_text() == WRAPPER_SCRIPT and os.access(wrapper, os.X_OK)
