"""Which binaries cargo builds from a crate directory, and the one-line refusal of a wrong name.

Every tree is also checked against ``cargo metadata`` when cargo is installed.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.flodl_crate import COMMAND, SECOND_COMMAND, generate
from fdl_tasks.cargo import binaries
from fdl_tasks.cargo.binaries import (
    binary_names,
    cargo_binary_names,
    check_binary,
    find_manifest,
    selected_packages,
)
from fdl_tasks.core.errors import FdlError

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "rig" / "fixture"
CARGO = shutil.which("cargo") or next(
    (str(p) for p in [Path.home() / ".cargo" / "bin" / "cargo"] if p.is_file()), None
)
needs_cargo = pytest.mark.skipif(CARGO is None, reason="cargo is not installed")

MAIN = "fn main() {}\n"


def write(path: Path, text: str = MAIN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def package(
    directory: Path,
    name: str,
    extra: str = "",
    *,
    edition: str | None = '"2021"',
    main: bool = True,
) -> Path:
    """A package manifest (``extra`` appended after ``[package]``'s keys) and src/main.rs."""
    lines = ["[package]", f'name = "{name}"', 'version = "0.1.0"']
    if edition is not None:
        lines.append(f"edition = {edition}")
    write(directory / "Cargo.toml", "\n".join(lines) + "\n" + extra)
    if main:
        write(directory / "src" / "main.rs")
    else:
        write(directory / "src" / "lib.rs", "")
    return directory


# ---------------------------------------------------------------------------- trees
# Each builds a crate tree under tmp_path and returns (crate dir, expected binaries).

Tree = Callable[[Path], tuple[Path, set[str]]]


def bin_with_path(root: Path) -> tuple[Path, set[str]]:
    """A [[bin]] naming src/main.rs takes that file: no bin named after the package."""
    package(root, "pkg", '[[bin]]\nname = "tool"\npath = "src/main.rs"\n')
    write(root / "src" / "bin" / "extra.rs")
    return root, {"tool", "extra"}


def bin_without_path(root: Path) -> tuple[Path, set[str]]:
    """A [[bin]] without path finds src/bin/<name>.rs; discovery adds the rest."""
    package(root, "pkg", '[[bin]]\nname = "worker"\ntest = false\n')
    write(root / "src" / "bin" / "worker.rs")
    write(root / "src" / "bin" / "other.rs")
    return root, {"pkg", "worker", "other"}


def bin_path_spelled_differently(root: Path) -> tuple[Path, set[str]]:
    """cargo compares paths component-wise: ``./`` is the same file, ``..`` is not."""
    package(
        root,
        "pkg",
        '[[bin]]\nname = "dot"\npath = "./src/bin/a.rs"\n'
        '[[bin]]\nname = "up"\npath = "src/bin/../bin/b.rs"\n',
    )
    write(root / "src" / "bin" / "a.rs")
    write(root / "src" / "bin" / "b.rs")
    return root, {"pkg", "dot", "up", "b"}


def autobins_off(root: Path) -> tuple[Path, set[str]]:
    package(root, "pkg", 'autobins = false\n[[bin]]\nname = "only"\npath = "src/only.rs"\n')
    write(root / "src" / "only.rs")
    write(root / "src" / "bin" / "ignored.rs")
    return root, {"only"}


def autobins_off_no_bins(root: Path) -> tuple[Path, set[str]]:
    package(root, "pkg", "autobins = false\n[lib]\npath = 'src/lib.rs'\n")
    write(root / "src" / "lib.rs", "")
    return root, set()


def dashed_package(root: Path) -> tuple[Path, set[str]]:
    """src/main.rs is a binary named exactly like the package, '-' included."""
    package(root, "ddp-bench")
    return root, {"ddp-bench"}


def bin_dir_layout(root: Path) -> tuple[Path, set[str]]:
    """src/bin/*.rs by stem, src/bin/<dir>/main.rs by dir; dot-entries, other files and
    directories without main.rs are not binaries; a library alone is not one either."""
    package(root, "lib-only", main=False)
    bin_dir = root / "src" / "bin"
    write(bin_dir / "alpha.rs")
    write(bin_dir / "multi" / "main.rs")
    write(bin_dir / "multi" / "helper.rs")
    write(bin_dir / "nomain" / "lib.rs")
    write(bin_dir / ".hidden.rs")
    write(bin_dir / ".dotdir" / "main.rs")
    write(bin_dir / "notes.txt", "")
    return root, {"alpha", "multi"}


def edition_2015(root: Path) -> tuple[Path, set[str]]:
    """No edition key (2015): a [[bin]] turns discovery off unless autobins says so."""
    package(root, "old", '[[bin]]\nname = "declared"\npath = "src/main.rs"\n', edition=None)
    write(root / "src" / "bin" / "found.rs")
    return root, {"declared"}


def edition_2015_no_bin_tables(root: Path) -> tuple[Path, set[str]]:
    """Without [[bin]] tables discovery runs in every edition."""
    package(root, "old", edition=None)
    write(root / "src" / "bin" / "found.rs")
    return root, {"old", "found"}


def edition_2015_empty_bin_array(root: Path) -> tuple[Path, set[str]]:
    """``bin = []`` counts as declared targets: edition 2015 discovers nothing."""
    write(root / "Cargo.toml", 'bin = []\n[package]\nname = "old"\nversion = "0.1.0"\n')
    write(root / "src" / "main.rs")
    write(root / "src" / "lib.rs", "")  # cargo refuses a package with no target at all
    return root, set()


def edition_2018_empty_bin_array(root: Path) -> tuple[Path, set[str]]:
    write(
        root / "Cargo.toml",
        'bin = []\n[package]\nname = "new"\nversion = "0.1.0"\nedition = "2018"\n',
    )
    write(root / "src" / "main.rs")
    return root, {"new"}


def edition_2015_autobins_on(root: Path) -> tuple[Path, set[str]]:
    package(
        root,
        "old",
        'autobins = true\n[[bin]]\nname = "declared"\npath = "src/main.rs"\n',
        edition='"2015"',
    )
    write(root / "src" / "bin" / "found.rs")
    return root, {"declared", "found"}


def inherited_edition(root: Path) -> tuple[Path, set[str]]:
    """edition.workspace = true reads [workspace.package] of the root above."""
    write(
        root / "Cargo.toml",
        '[workspace]\nresolver = "2"\nmembers = ["app", "legacy"]\n'
        '[workspace.package]\nedition = "2021"\n',
    )
    package(
        root / "app",
        "app",
        '[[bin]]\nname = "explicit"\npath = "src/main.rs"\n',
        edition="{ workspace = true }",
    )
    write(root / "app" / "src" / "bin" / "discovered.rs")
    package(root / "legacy", "legacy", edition='"2015"')
    return root / "app", {"explicit", "discovered"}


def _globbed_workspace(root: Path, default_members: str = "") -> None:
    write(
        root / "Cargo.toml",
        '[workspace]\nresolver = "2"\nmembers = ["crates/*", "tools/cli"]\n'
        f'exclude = ["crates/experimental"]\n{default_members}',
    )
    package(root / "crates" / "core", "core", main=False)
    package(root / "crates" / "train", "train")
    package(
        root / "crates" / "serve",
        "serve",
        '[dependencies]\nhelper = { path = "../../helper" }\n'
        "[target.'cfg(unix)'.dev-dependencies]\nshared = { workspace = true }\n",
    )
    write(root / "crates" / "serve" / "src" / "bin" / "serve-admin.rs")
    package(root / "crates" / "experimental", "experimental")
    package(root / "tools" / "cli", "fdl-cli")
    # path dependencies under the root are members even though no entry lists them
    package(root / "helper", "helper")
    package(root / "libs" / "shared", "shared-tool")
    write(
        root / "Cargo.toml",
        (root / "Cargo.toml").read_text()
        + '[workspace.dependencies]\nshared = { path = "libs/shared", package = "shared-tool" }\n',
    )


def virtual_globbed(root: Path) -> tuple[Path, set[str]]:
    """A virtual manifest builds every member: globbed, minus exclude, plus path deps."""
    _globbed_workspace(root)
    return root, {"train", "serve", "serve-admin", "fdl-cli", "helper", "shared-tool"}


def virtual_default_members(root: Path) -> tuple[Path, set[str]]:
    """default-members (globs too) narrow what a virtual root builds."""
    _globbed_workspace(root, 'default-members = ["crates/s*", "tools/cli"]\n')
    return root, {"serve", "serve-admin", "fdl-cli"}


def nested_member(root: Path) -> tuple[Path, set[str]]:
    """In a member directory cargo builds that package alone (default-members ignored)."""
    _globbed_workspace(root, 'default-members = ["tools/cli"]\n')
    return root / "crates" / "serve", {"serve", "serve-admin"}


def below_member(root: Path) -> tuple[Path, set[str]]:
    """A directory without Cargo.toml: cargo uses the nearest manifest above it."""
    _globbed_workspace(root)
    return root / "crates" / "train" / "src", {"train"}


def excluded_member(root: Path) -> tuple[Path, set[str]]:
    """An excluded directory is its own workspace."""
    _globbed_workspace(root)
    return root / "crates" / "experimental", {"experimental"}


def root_package_workspace(root: Path) -> tuple[Path, set[str]]:
    """A root that is a package and a workspace builds the root package alone."""
    package(root, "root-app", '[workspace]\nmembers = ["member"]\n')
    package(root / "member", "member-bin")
    return root, {"root-app"}


def root_package_default_members(root: Path) -> tuple[Path, set[str]]:
    package(
        root, "root-app", '[workspace]\nmembers = ["member"]\ndefault-members = [".", "member"]\n'
    )
    package(root / "member", "member-bin")
    return root, {"root-app", "member-bin"}


def rig_fixture(root: Path) -> tuple[Path, set[str]]:
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("target"))
    return root, {"ddp-bench", "ddp-eval"}


TREES: list[Tree] = [
    bin_with_path,
    bin_without_path,
    bin_path_spelled_differently,
    autobins_off,
    autobins_off_no_bins,
    dashed_package,
    bin_dir_layout,
    edition_2015,
    edition_2015_no_bin_tables,
    edition_2015_empty_bin_array,
    edition_2018_empty_bin_array,
    edition_2015_autobins_on,
    inherited_edition,
    virtual_globbed,
    virtual_default_members,
    nested_member,
    below_member,
    excluded_member,
    root_package_workspace,
    root_package_default_members,
    rig_fixture,
]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.__name__)
def test_binary_names(tree: Tree, tmp_path: Path) -> None:
    crate, expected = tree(tmp_path)
    assert binary_names(crate) == expected


@needs_cargo
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.__name__)
def test_agrees_with_cargo_metadata(tree: Tree, tmp_path: Path) -> None:
    crate, expected = tree(tmp_path)
    assert cargo_binary_names(crate, cargo=CARGO, timeout=60) == frozenset(expected)
    assert binary_names(crate) == expected


# ---------------------------------------------------------------------------- the repo's crates


def test_real_fixture_in_place() -> None:
    """rig/fixture as the demo builds it: the virtual root and the crate directory."""
    assert binary_names(FIXTURE) == {"ddp-bench", "ddp-eval"}
    assert binary_names(FIXTURE / "ddp-bench") == {"ddp-bench", "ddp-eval"}
    check_binary("ddp-bench", FIXTURE / "ddp-bench", use_cargo=False)


def test_fixture_is_fast() -> None:
    binary_names(FIXTURE / "ddp-bench")
    started = time.perf_counter()
    for _ in range(20):
        binary_names(FIXTURE / "ddp-bench")
        binary_names(FIXTURE)
    assert (time.perf_counter() - started) / 40 < 0.05


def test_generated_flodl_crate(tmp_path: Path) -> None:
    """bench/flodl_crate.py's workspace: many library members, two binaries in one package."""
    root = generate(tmp_path / "flodl")
    both = frozenset({COMMAND, SECOND_COMMAND})
    assert binary_names(root) == both
    assert binary_names(root / COMMAND) == both
    assert {p.name for p in selected_packages(root)} >= {COMMAND, "tch", "torch-sys"}
    assert binary_names(root / "tch") == set()
    if CARGO is not None:
        assert cargo_binary_names(root / COMMAND, cargo=CARGO, timeout=60) == both
        assert cargo_binary_names(root, cargo=CARGO, timeout=60) == both


def test_generated_flodl_crate_other_command(tmp_path: Path) -> None:
    root = generate(tmp_path / "flodl", command="train-net")
    assert binary_names(root / "train-net") == {"train-net", SECOND_COMMAND}


# ---------------------------------------------------------------------------- bad manifests


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    manifest = write(tmp_path / "Cargo.toml", '[package]\nname = "x\n')
    with pytest.raises(FdlError) as caught:
        binary_names(tmp_path)
    message = str(caught.value)
    assert str(manifest) in message and "not valid TOML" in message and "\n" not in message


def test_malformed_member_names_the_member(tmp_path: Path) -> None:
    write(tmp_path / "Cargo.toml", '[workspace]\nmembers = ["a"]\n')
    broken = write(tmp_path / "a" / "Cargo.toml", "[package\n")
    with pytest.raises(FdlError, match=re.escape(str(broken))):
        binary_names(tmp_path)


def test_unreadable_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = write(tmp_path / "Cargo.toml", '[package]\nname = "x"\n')
    real_open = Path.open

    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == manifest:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(FdlError) as caught:
        binary_names(tmp_path)
    assert str(caught.value) == f"cannot read {manifest}: Permission denied"


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "Cargo.toml").write_bytes(b'[package]\nname = "\xff"\n')
    with pytest.raises(FdlError, match="not valid TOML"):
        binary_names(tmp_path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[package]\nversion = "1"\n', "has no name"),
        (
            '[package]\nname = "p"\n[[bin]]\npath = "src/main.rs"\n',
            r"\[\[bin\]\] entry 1 has no name",
        ),
        ('[package]\nname = "p"\nautobins = "no"\n', "'autobins' must be true or false"),
        ('bin = "x"\n[package]\nname = "p"\n', "array of tables"),
        ('[dependencies]\nserde = "1"\n', r"neither \[package\] nor \[workspace\]"),
        ('[workspace]\nmembers = "a"\n', "'members' must be a list"),
        ('package = "p"\n', "'package' must be a table"),
    ],
)
def test_manifest_shape_errors(tmp_path: Path, text: str, match: str) -> None:
    manifest = write(tmp_path / "Cargo.toml", text)
    with pytest.raises(FdlError, match=match) as caught:
        binary_names(tmp_path)
    assert str(manifest) in str(caught.value)


def test_no_manifest_anywhere(tmp_path: Path) -> None:
    if any((parent / "Cargo.toml").is_file() for parent in tmp_path.parents):
        pytest.skip("a Cargo.toml above the temporary directory")
    expected = f"no Cargo.toml in {tmp_path} or any parent directory"
    with pytest.raises(FdlError, match=re.escape(expected)):
        find_manifest(tmp_path)


def test_lenient_where_cargo_would_fail(tmp_path: Path) -> None:
    """Mistakes cargo reports itself keep the visible names: a glob matching a directory
    without Cargo.toml, a [[bin]] whose file is missing, a missing path dependency."""
    write(tmp_path / "Cargo.toml", '[workspace]\nmembers = ["crates/*", "gone"]\n')
    (tmp_path / "crates" / "notes").mkdir(parents=True)
    package(tmp_path / "crates" / "a", "a", '[[bin]]\nname = "ghost"\n')
    package(tmp_path / "crates" / "b", "b", '[dependencies]\nnope = { path = "../nope" }\n')
    assert binary_names(tmp_path) == {"a", "ghost", "b"}


def test_missing_path_dependency_falls_back_to_files(tmp_path: Path) -> None:
    """cargo metadata fails on a member whose path dependency does not exist."""
    write(tmp_path / "Cargo.toml", '[workspace]\nresolver = "2"\nmembers = ["app"]\n')
    package(tmp_path / "app", "app", '[dependencies]\nghost = { path = "../ghost" }\n')
    if CARGO is not None:
        assert cargo_binary_names(tmp_path / "app", cargo=CARGO, timeout=60) is None
    check_binary("app", tmp_path / "app", cargo=CARGO)
    with pytest.raises(FdlError, match="did you mean 'app'"):
        check_binary("apq", tmp_path / "app", cargo=CARGO)


# ---------------------------------------------------------------------------- the refusal


def test_refusal_message(tmp_path: Path) -> None:
    crate = package(tmp_path / "ddp-bench", "ddp-bench")
    write(crate / "src" / "bin" / "train.rs")
    with pytest.raises(FdlError) as caught:
        check_binary("ddp-bnech", crate, use_cargo=False)
    assert str(caught.value) == (
        f"no binary 'ddp-bnech' in {crate} (Cargo.toml): did you mean 'ddp-bench'? "
        "binaries: ddp-bench, train"
    )


def test_underscore_and_case_are_suggested_first(tmp_path: Path) -> None:
    crate = package(tmp_path, "ddp-bench")
    write(crate / "src" / "bin" / "ddp-bench2.rs")
    with pytest.raises(FdlError, match="did you mean 'ddp-bench' or 'ddp-bench2'"):
        check_binary("DDP_Bench", crate, use_cargo=False)


def test_no_close_match_lists_binaries(tmp_path: Path) -> None:
    package(tmp_path, "alpha")
    with pytest.raises(FdlError) as caught:
        check_binary("zzz", tmp_path, use_cargo=False)
    assert str(caught.value) == f"no binary 'zzz' in {tmp_path} (Cargo.toml): binaries: alpha"


def test_many_binaries_are_truncated(tmp_path: Path) -> None:
    package(tmp_path, "pkg", main=False)
    for index in range(30):
        write(tmp_path / "src" / "bin" / f"tool{index:02d}.rs")
    with pytest.raises(FdlError) as caught:
        check_binary("nothing-like-it", tmp_path, use_cargo=False)
    message = str(caught.value)
    assert "tool00, tool01" in message and "tool11, ... (18 more)" in message
    assert "tool12" not in message


def test_crate_without_binaries(tmp_path: Path) -> None:
    package(tmp_path, "just-a-lib", main=False)
    with pytest.raises(FdlError, match=r"\(Cargo\.toml\): it has no binary targets$"):
        check_binary("ddp-bench", tmp_path, use_cargo=False)


def test_binary_of_another_member_is_pointed_at(tmp_path: Path) -> None:
    """cargo answers 'no bin target named ... in default-run packages'; we name the member."""
    crate, _ = root_package_workspace(tmp_path)
    with pytest.raises(FdlError) as caught:
        check_binary("member-bin", crate, use_cargo=False)
    assert str(caught.value).endswith(
        f"binaries: root-app; 'member-bin' is in {tmp_path / 'member'} (package 'member-bin'), "
        "which cargo does not build from here: pick that crate directory (--crate-dir)"
    )


def test_sibling_member_is_pointed_at(tmp_path: Path) -> None:
    crate, _ = nested_member(tmp_path)
    with pytest.raises(FdlError, match=r"'fdl-cli' is in .*tools/cli \(package 'fdl-cli'\)"):
        check_binary("fdl-cli", crate, use_cargo=False)


def test_manifest_found_above_is_named(tmp_path: Path) -> None:
    crate, _ = below_member(tmp_path)
    location = f"in {tmp_path / 'crates' / 'train'} (Cargo.toml)"
    with pytest.raises(FdlError, match=re.escape(location)):
        check_binary("tran", crate, use_cargo=False)


def test_known_name_never_runs_cargo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("cargo metadata ran on the fast path")

    monkeypatch.setattr(binaries, "cargo_binary_names", forbidden)
    check_binary("ddp-bench", package(tmp_path, "ddp-bench"))


def test_cargo_has_the_last_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name the files miss but cargo knows passes; cargo's list is the one shown."""
    package(tmp_path, "pkg")
    monkeypatch.setattr(binaries, "cargo_binary_names", lambda *a, **k: frozenset({"pkg", "x"}))
    check_binary("x", tmp_path)
    with pytest.raises(FdlError, match=r"binaries: pkg, x$"):
        check_binary("y", tmp_path)
    with pytest.raises(FdlError, match=r"binaries: pkg$"):
        check_binary("x", tmp_path, use_cargo=False)


TOML_11 = (
    '[package]\nname = "new-syntax"\nversion = "0.1.0"\nedition = "2021"\n'
    '[dependencies]\nx = {\n  path = "x",\n}\n'
)


def test_toml_11_without_cargo_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "Cargo.toml", TOML_11)
    write(tmp_path / "src" / "main.rs")
    with pytest.raises(FdlError, match="is not valid TOML"):
        check_binary("new-syntax", tmp_path, use_cargo=False)


@needs_cargo
def test_toml_11_that_cargo_reads(tmp_path: Path) -> None:
    """tomllib reads TOML 1.0; a new cargo also reads 1.1 (a multi-line inline table)."""
    write(tmp_path / "Cargo.toml", TOML_11)
    write(tmp_path / "src" / "main.rs")
    package(tmp_path / "x", "x", main=False)
    if cargo_binary_names(tmp_path, cargo=CARGO, timeout=60) is None:
        pytest.skip("this cargo does not read TOML 1.1")
    check_binary("new-syntax", tmp_path, cargo=CARGO, timeout=60)
    with pytest.raises(FdlError, match="did you mean 'new-syntax'"):
        check_binary("new-syntx", tmp_path, cargo=CARGO, timeout=60)


# ---------------------------------------------------------------------------- cargo metadata


def fake_cargo(tmp_path: Path, script: str) -> str:
    path = write(tmp_path / "fake-cargo", "#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_cargo_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package(tmp_path, "p")
    assert cargo_binary_names(tmp_path, cargo=str(tmp_path / "no-such-cargo")) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cargo_binary_names(tmp_path) is None


def test_cargo_timeout_is_bounded(tmp_path: Path) -> None:
    package(tmp_path, "p")
    cargo = fake_cargo(tmp_path, "sleep 30 & sleep 30\n")
    started = time.monotonic()
    assert cargo_binary_names(tmp_path, cargo=cargo, timeout=0.3) is None
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "script", ["echo 'not json'\n", "echo '[]'\n", "echo '{\"packages\": []}'\n", "exit 101\n"]
)
def test_cargo_unexpected_output(tmp_path: Path, script: str) -> None:
    package(tmp_path, "p")
    assert cargo_binary_names(tmp_path, cargo=fake_cargo(tmp_path, script)) is None


def test_cargo_metadata_parsing(tmp_path: Path) -> None:
    document = (
        '{"packages": ['
        '{"id": "a", "targets": [{"name": "a-bin", "kind": ["bin"]},'
        ' {"name": "a", "kind": ["lib"]}]},'
        '{"id": "b", "targets": [{"name": "b-bin", "kind": ["bin"]}]}'
        '], "workspace_default_members": ["a"]}'
    )
    package(tmp_path, "p")
    cargo = fake_cargo(tmp_path, f"printf '%s\\n' '{document}'\n")
    assert cargo_binary_names(tmp_path, cargo=cargo) == frozenset({"a-bin"})
