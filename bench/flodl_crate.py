"""Generate a project shaped like a flodl project, for the compile cache's tests and benchmark.

crates.io is out of reach here, so the crates flodl builds against are
generated as path crates of one cargo workspace (with its ``Cargo.lock``,
so it builds offline)::

    Cargo.toml, Cargo.lock        the workspace
    torch-sys/                    build.rs compiles shim/torch_shim.c against
                                  $LIBTORCH_PATH/include/torch_shim.h with $CC_<target>,
                                  $CC or cc, archives it (ar) into $OUT_DIR/libtorchshim.a,
                                  links it (rustc-link-lib=static=torchshim) and links
                                  $LIBTORCH_PATH/lib/libtorch.so (rustc-link-lib=dylib=torch);
                                  shim_abi() comes from the shim, variant() from libtorch.so
    tch/                          a library over torch-sys (and dep0)
    crates/dep<i>/                ordinary crates with generated tensor code, instantiated
                                  inside each crate so the compile time stays there; dep<i>
                                  depends on dep<i-2> (two chains, as on two cores)
    ddp-bench/                    the package of the binaries (feature ``cuda``):
                                  ``ddp-bench`` (src/main.rs) prints
                                  ``ddp-bench variant=<arch> shim=<abi> cuda=on|off``,
                                  ``ddp-eval`` (src/bin/eval.rs), a second command of
                                  the same package, prints the same with its own name
    .cargo/config.toml, vendor/   with ``Size.third_party``: real crates.io crates
                                  (serde with derive, serde_json, regex and what they
                                  pull in) as Debian packages them, copied from
                                  /usr/share/cargo/registry into a directory source,
                                  so the build stays offline (in containers too)
    libtorch/<arch>/include/torch_shim.h   #define FDL_TORCH_ABI <abi>: the caller picks
    libtorch/<arch>/lib/libtorch.so        the rig's stub (rig/fixture/stub_libtorch.c)

Two variants given the same ABI value get byte-identical headers, so torch-sys
compiles to the same archive; different values, different archives.

:data:`TINY` is for tests (a few seconds cold), :data:`BENCH` for the benchmark
(about 12 s for a cold native release build on a 2-core machine), :data:`LOOP`
for the everyday-loop benchmark (generated crates plus the real third-party ones;
it needs the Debian packages of :data:`DEBIAN_PACKAGES`).

Usage::

    python3 -m bench.flodl_crate DIR [--size tiny|bench|loop] [--deps N] [--modules N]
                                 [--funcs N] [--kinds N] [--variant ARCH=ABI ...] [--time ARCH]

``FDL_TORCH_SYS_SLEEP=SECS`` in a build's environment makes torch-sys's build
script sleep that long first (a build kept in flight, for tests).

``--time ARCH`` builds the generated workspace cold with native cargo against
that variant (in a temporary target dir) and prints the wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from rig.project import add_variant, libtorch_dir

__all__ = [
    "BENCH",
    "COMMAND",
    "DEBIAN_PACKAGES",
    "LOOP",
    "SECOND_COMMAND",
    "SIZES",
    "TINY",
    "Size",
    "add_libtorch",
    "cacheable_crates",
    "expected_line",
    "generate",
    "layout_variants",
    "time_cold_build",
]

#: The binary's name (and its crate's directory).
COMMAND = "ddp-bench"
#: A second binary of the same package (``src/bin/eval.rs``): a second command.
SECOND_COMMAND = "ddp-eval"

#: Where Debian's ``librust-*-dev`` packages put their crate sources.
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
#: The Debian packages that bring the third-party crates (and everything they need).
DEBIAN_PACKAGES = (
    "librust-serde-derive-dev",
    "librust-serde-json-dev",
    "librust-regex+default-dev",
)
#: The binary package's third-party dependencies (name → Cargo.toml requirement).
THIRD_PARTY = {
    "serde": '{ version = "1", features = ["derive"] }',
    "serde_json": '"1"',
    "regex": '"1"',
}
_CARGO_CONFIG = """\
# Written by bench/flodl_crate.py: crates.io crates come from vendor/ (Debian's
# packaged sources), so builds never touch the network.
[source.crates-io]
replace-with = "vendored"

[source.vendored]
directory = "vendor"
"""

#: (element type, matrix size) pairs a layer is instantiated for, in the order used.
_KINDS = [(ty, dim) for dim in (3, 6) for ty in ("f32", "i64", "u32", "f64", "i32", "u64")]


@attrs.frozen
class Size:
    """How much code: ``deps`` ordinary crates of ``modules`` modules of ``funcs`` layers
    each, every layer instantiated for ``kinds`` (element type, size) pairs (up to 12)."""

    deps: int = attrs.field(validator=attrs.validators.ge(1))
    modules: int = attrs.field(validator=attrs.validators.ge(1))
    funcs: int = attrs.field(validator=attrs.validators.ge(1))
    kinds: int = attrs.field(
        default=len(_KINDS), validator=[attrs.validators.ge(1), attrs.validators.le(len(_KINDS))]
    )
    #: The binary package also depends on the real crates of :data:`THIRD_PARTY`.
    third_party: bool = False


#: A few seconds cold: for tests.
TINY = Size(deps=3, modules=1, funcs=1, kinds=2)
#: About 12 s for a cold native release build on the 2-core benchmark machine.
BENCH = Size(deps=6, modules=1, funcs=3)
#: The everyday loop: real third-party crates (serde, serde_json, regex …) beside a
#: few generated ones.
LOOP = Size(deps=2, modules=1, funcs=1, third_party=True)
#: A heavier workspace, as a new user's: 28 generated path crates in two chains beside
#: torch-sys (a build script), tch, the binaries' package and the real third-party
#: crates (several with build scripts): 40-odd crates.
WORKSPACE = Size(deps=28, modules=1, funcs=1, kinds=2, third_party=True)
SIZES = {"tiny": TINY, "bench": BENCH, "loop": LOOP, "workspace": WORKSPACE}


def cacheable_crates(size: Size) -> int:
    """rustc calls sccache may cache in one build: every library (binaries and build
    scripts are never cached): the ordinary crates, torch-sys and tch."""
    return size.deps + 2


def expected_line(arch: str, abi: int, cuda: bool = True) -> str:
    """The first line the binary prints when it runs against ``arch`` built with ``abi``."""
    return f"{COMMAND} variant={arch} shim={abi} cuda={'on' if cuda else 'off'}"


def edit_main(crate_dir: Path, rev: str) -> None:
    """A one-line edit of the command's ``src/main.rs``: its first ``println!`` gains
    ``rev=<rev>`` (replacing an earlier edit's), so that its binary says which edit it is."""
    main = crate_dir / "src" / "main.rs"
    text = re.sub(r' rev=[^"]*"\);', '");', main.read_text(), count=1)
    pattern = r'(println!\("[^"]*cuda=\{cuda\})("\);)'
    text, count = re.subn(pattern, rf"\1 rev={rev}\2", text, count=1)
    if count != 1:
        raise ValueError(f"no line to edit in {main}")
    main.write_text(text)


# ---------------------------------------------------------------------------- templates

_WORKSPACE = """\
[workspace]
members = [MEMBERS]
resolver = "2"
"""

_PACKAGE = """\
[package]
name = "NAME"
version = "0.1.0"
edition = "2021"
publish = false
EXTRA
[dependencies]
DEPS"""

_TORCH_SYS_EXTRA = 'links = "torch"\nbuild = "build.rs"\n'

_BIN_EXTRA = """\

[[bin]]
name = "NAME"
path = "src/main.rs"

[[bin]]
name = "SECOND"
path = "src/bin/eval.rs"

[features]
default = []
cuda = []
"""

_BUILD_RS = r"""//! torch-sys's build script, shaped like the real one (with the `cc` crate):
//! a C shim compiled against the variant's headers, archived into OUT_DIR and
//! linked statically; libtorch itself linked as a shared library. No rpath:
//! the binary starts only when the loader finds libtorch.so (LD_LIBRARY_PATH).
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// `$<TOOL>_<target>` (both spellings), then `$<TOOL>`, then `fallback`, as cc-rs looks.
fn tool(name: &str, fallback: &str) -> String {
    let target = env::var("TARGET").unwrap_or_default();
    let keys = [
        format!("{name}_{target}"),
        format!("{name}_{}", target.replace('-', "_")),
        name.to_string(),
    ];
    for key in &keys {
        println!("cargo:rerun-if-env-changed={key}");
    }
    keys.iter()
        .find_map(|key| env::var(key).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| fallback.to_string())
}

fn run(command: &mut Command) {
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("torch-sys: {command:?} failed: {status}"),
        Err(err) => panic!("torch-sys: cannot run {command:?}: {err}"),
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH_PATH");
    println!("cargo:rerun-if-changed=shim/torch_shim.c");
    // Tests that need a build in flight make it last this many seconds.
    println!("cargo:rerun-if-env-changed=FDL_TORCH_SYS_SLEEP");
    if let Some(secs) = env::var("FDL_TORCH_SYS_SLEEP").ok().and_then(|s| s.parse::<f64>().ok()) {
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    }
    let root = match env::var_os("LIBTORCH_PATH") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!("torch-sys: LIBTORCH_PATH is not set; point it at a libtorch directory"),
    };
    let (include, lib_dir) = (root.join("include"), root.join("lib"));
    for needed in [include.join("torch_shim.h"), lib_dir.join("libtorch.so")] {
        if !needed.is_file() {
            panic!("torch-sys: {} does not exist", needed.display());
        }
        println!("cargo:rerun-if-changed={}", needed.display());
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let (object, archive) = (out.join("torch_shim.o"), out.join("libtorchshim.a"));
    run(Command::new(tool("CC", "cc"))
        .args(["-c", "-O2", "-fPIC", "-I"])
        .arg(&include)
        .arg("shim/torch_shim.c")
        .arg("-o")
        .arg(&object));
    let _ = std::fs::remove_file(&archive);
    run(Command::new(tool("AR", "ar")).arg("crsD").arg(&archive).arg(&object));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=torchshim");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch");
}
"""

_SHIM_C = """\
/* Compiled by torch-sys's build.rs against the variant's include/torch_shim.h. */
#include <torch_shim.h>

#ifndef FDL_TORCH_ABI
#error "torch_shim.h must define FDL_TORCH_ABI"
#endif

int fdl_shim_abi(void) { return FDL_TORCH_ABI; }
"""

_TORCH_SYS_LIB = """\
//! Bindings: the C shim (compiled against the variant's headers) and libtorch.
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

extern "C" {
    fn fdl_shim_abi() -> c_int;
    fn fdl_torch_variant() -> *const c_char;
}

/// The `FDL_TORCH_ABI` of the headers the shim was compiled against.
pub fn shim_abi() -> i32 {
    // SAFETY: a plain C function without arguments.
    unsafe { fdl_shim_abi() }
}

/// The variant of the libtorch.so the loader picked up.
pub fn variant() -> String {
    // SAFETY: the stub returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(fdl_torch_variant()) }.to_string_lossy().into_owned()
}
"""

_TCH_LIB = """\
//! A tch-like layer over torch-sys.
pub use torch_sys;

/// What the running binary is linked with: libtorch's variant, the shim's ABI.
pub fn linked() -> (String, i32) {
    (torch_sys::variant(), torch_sys::shim_abi())
}

/// A first computation, as a model's warm-up step.
pub fn warm_up(seed: u64) -> u64 {
    dep0::run(seed ^ torch_sys::shim_abi() as u64)
}
"""

_MAIN = """\
//! Generated by bench/flodl_crate.py: prints what it is linked with, then computes.
USES
fn main() {
    let (variant, abi) = tch::linked();
    let cuda = if cfg!(feature = "cuda") { "on" } else { "off" };
    println!("NAME variant={variant} shim={abi} cuda={cuda}");
    let seed = std::env::args().count() as u64;
    let mut acc = tch::warm_up(seed);
    RUNS
    CONFIG
    println!("checksum={acc:016x}");
}
"""

#: With third-party crates: a run configuration read as JSON, its name checked by a regex.
_CONFIG_ITEMS = """\
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct RunConfig {
    name: String,
    ranks: Vec<u32>,
    lr: f64,
}
"""

_CONFIG_USE = """\
let config: RunConfig = serde_json::from_str(r#"{"name":"run-7","ranks":[0,1],"lr":0.5}"#)
        .expect("a valid run configuration");
    let named = regex::Regex::new(r"^run-[0-9]+$").expect("a valid pattern");
    acc ^= config.ranks.len() as u64 ^ u64::from(named.is_match(&config.name));
    println!("config={}", serde_json::to_string(&config).expect("serializable"));"""

_DEP_LIB = """\
//! Generated by bench/flodl_crate.py: an ordinary dependency (crate IDX).
MODS
/// Every module's layers, so that the code is compiled (and cached) in this crate.
pub fn run(seed: u64) -> u64 {
    let mut acc = seed ^ IDX;
    RUNS
    acc
}
"""

_MODULE = """\
//! Generated tensor code: small fixed-size matrices, every layer instantiated
//! for (element type, size) pairs inside `run`.
use std::hint::black_box;

pub trait Elem: Copy + Default + PartialOrd {
    fn of(v: u64) -> Self;
    fn bits(self) -> u64;
    fn plus(self, o: Self) -> Self;
    fn times(self, o: Self) -> Self;
    fn relu(self) -> Self {
        if self > Self::default() { self } else { Self::default() }
    }
}

macro_rules! ints {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn of(v: u64) -> Self { v as $t }
            fn bits(self) -> u64 { self as u64 }
            fn plus(self, o: Self) -> Self { self.wrapping_add(o) }
            fn times(self, o: Self) -> Self { self.wrapping_mul(o) }
        }
    )*};
}

macro_rules! floats {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn of(v: u64) -> Self { (v % 997) as $t / 61.0 - 8.0 }
            fn bits(self) -> u64 { self.to_bits() as u64 }
            fn plus(self, o: Self) -> Self { self + o }
            fn times(self, o: Self) -> Self { self * o }
        }
    )*};
}

ints!(i32, i64, u32, u64);
floats!(f32, f64);

#[derive(Clone, Copy, Debug)]
pub struct Tensor<T, const R: usize, const C: usize> {
    pub data: [[T; C]; R],
}

impl<T: Elem, const R: usize, const C: usize> Tensor<T, R, C> {
    pub fn seeded(seed: u64) -> Self {
        let mut data = [[T::default(); C]; R];
        for (i, row) in data.iter_mut().enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = T::of(seed.rotate_left(((i * C + j) % 63) as u32) ^ SALT);
            }
        }
        Self { data }
    }

    pub fn matmul<const K: usize>(&self, other: &Tensor<T, C, K>) -> Tensor<T, R, K> {
        let mut data = [[T::default(); K]; R];
        for (i, row) in data.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                let terms = (0..C).map(|j| self.data[i][j].times(other.data[j][k]));
                *x = terms.fold(T::default(), |s, v| s.plus(v));
            }
        }
        Tensor { data }
    }

    pub fn t(&self) -> Tensor<T, C, R> {
        let mut data = [[T::default(); R]; C];
        for (i, row) in self.data.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                data[j][i] = x;
            }
        }
        Tensor { data }
    }

    pub fn map(&self, f: impl Fn(T) -> T) -> Self {
        Self { data: self.data.map(|row| row.map(&f)) }
    }

    pub fn sum(&self) -> T {
        self.data.iter().flatten().fold(T::default(), |s, &x| s.plus(x))
    }

    pub fn max(&self) -> T {
        self.data.iter().flatten().fold(self.data[0][0], |m, &x| if x > m { x } else { m })
    }
}

FUNCS
pub fn run(seed: u64) -> u64 {
    let mut acc = seed ^ SALT;
    CALLS
    acc
}
"""

_FUNC = """\
pub fn layer_J<T: Elem, const N: usize>(x: &Tensor<T, N, N>, w: &Tensor<T, N, N>) -> u64 {
    let h = x.matmul(w).map(Elem::relu);
    let y = h.matmul(&w.t()).map(|v| v.plus(T::of(J)).relu());
    let z = y.t().matmul(&h).map(|v| v.times(T::of(J + 1)));
    z.sum().bits().rotate_left(J) ^ y.max().bits() ^ h.sum().bits()
}
"""

_CALL = (
    "acc = acc.rotate_left(7) ^ layer_J::<TY, DIM>("
    "black_box(&Tensor::seeded(acc)), black_box(&Tensor::seeded(acc ^ J)));"
)

_LOCK_HEADER = """\
# This file is automatically @generated by Cargo.
# It is not intended for manual editing.
version = 4
"""


# ---------------------------------------------------------------------------- rendering

#: Crate name → its directory in the workspace and the crates it depends on.
_Graph = dict[str, tuple[str, list[str]]]


def _dep_names(size: Size) -> list[str]:
    return [f"dep{i}" for i in range(size.deps)]


def _graph(size: Size, command: str) -> _Graph:
    """Every crate: its directory in the workspace and the crates it depends on."""
    deps = _dep_names(size)
    crates = {
        name: (f"crates/{name}", deps[max(i - 2, 0) : max(i - 1, 0)]) for i, name in enumerate(deps)
    }
    crates["torch-sys"] = ("torch-sys", [])
    crates["tch"] = ("tch", ["dep0", "torch-sys"])
    crates[command] = (command, ["tch", *deps])
    return crates


def _manifest(name: str, graph: _Graph, command: str, third_party: bool = False) -> str:
    directory, deps = graph[name]
    up = "../" * (directory.count("/") + 1)
    lines = "".join(f'{d} = {{ path = "{up}{graph[d][0]}" }}\n' for d in deps)
    if name == command and third_party:
        lines += "".join(f"{d} = {req}\n" for d, req in THIRD_PARTY.items())
    binaries = _BIN_EXTRA.replace("NAME", command).replace("SECOND", SECOND_COMMAND)
    extra = {"torch-sys": _TORCH_SYS_EXTRA, command: binaries}
    return (
        _PACKAGE.replace("NAME", name).replace("EXTRA", extra.get(name, "")).replace("DEPS", lines)
    )


def _lockfile(graph: _Graph) -> str:
    """What cargo writes for a workspace of path crates (no sources, no checksums)."""
    blocks = [_LOCK_HEADER]
    for name in sorted(graph):
        block = f'\n[[package]]\nname = "{name}"\nversion = "0.1.0"\n'
        deps = sorted(graph[name][1])
        if deps:
            block += "dependencies = [\n" + "".join(f' "{d}",\n' for d in deps) + "]\n"
        blocks.append(block)
    return "".join(blocks)


def _module(crate: int, module: int, size: Size) -> str:
    salt = str(1_000 * crate + module + 1)
    body = "\n".join(_FUNC.replace("J", str(j)) for j in range(size.funcs))
    calls = "\n    ".join(
        _CALL.replace("J", str(j)).replace("TY", ty).replace("DIM", str(dim))
        for j in range(size.funcs)
        for ty, dim in _KINDS[: size.kinds]
    )
    return _MODULE.replace("FUNCS", body).replace("CALLS", calls).replace("SALT", salt)


def _dep_lib(crate: int, size: Size) -> str:
    mods = "".join(f"pub mod m{m};\n" for m in range(size.modules))
    runs = "\n    ".join(f"acc ^= m{m}::run(acc);" for m in range(size.modules))
    if crate >= 2:
        runs += f"\n    acc ^= dep{crate - 2}::run(acc);"
    return _DEP_LIB.replace("MODS", mods).replace("RUNS", runs).replace("IDX", str(crate))


# ---------------------------------------------------------------------------- writing


def _write_if_changed(path: Path, text: str) -> None:
    """Unchanged files are left alone, so a regenerated project keeps cargo's fingerprints."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        path.write_text(text, encoding="utf-8")


def _write_dep(root: Path, crate: int, size: Size) -> None:
    src = root / "crates" / f"dep{crate}" / "src"
    wanted = {f"m{module}.rs" for module in range(size.modules)}
    for stale in src.glob("m*.rs"):
        if stale.name not in wanted:
            stale.unlink()
    _write_if_changed(src / "lib.rs", _dep_lib(crate, size))
    for module in range(size.modules):
        _write_if_changed(src / f"m{module}.rs", _module(crate, module, size))


def _main_rs(name: str, deps: list[str], third_party: bool) -> str:
    runs = "\n    ".join(f"acc ^= {dep}::run(acc);" for dep in deps)
    text = _MAIN.replace("NAME", name).replace("RUNS", runs)
    if third_party:
        return text.replace("USES", _CONFIG_ITEMS).replace("CONFIG", _CONFIG_USE)
    return text.replace("USES\n", "").replace("    CONFIG\n", "")


def _write_special(root: Path, command: str, deps: list[str], third_party: bool = False) -> None:
    """torch-sys (build script, C shim, bindings), tch and the two binaries' sources."""
    _write_if_changed(root / "torch-sys" / "build.rs", _BUILD_RS)
    _write_if_changed(root / "torch-sys" / "shim" / "torch_shim.c", _SHIM_C)
    _write_if_changed(root / "torch-sys" / "src" / "lib.rs", _TORCH_SYS_LIB)
    _write_if_changed(root / "tch" / "src" / "lib.rs", _TCH_LIB)
    _write_if_changed(root / command / "src" / "main.rs", _main_rs(command, deps, third_party))
    second = _main_rs(SECOND_COMMAND, deps[:1], third_party)
    _write_if_changed(root / command / "src" / "bin" / "eval.rs", second)


def generate(root: Path, size: Size = TINY, *, command: str = COMMAND) -> Path:
    """Write the workspace into ``root`` (created; libtorch variants and ``target/`` are
    left alone); returns ``root``. Idempotent: unchanged files keep their mtimes."""
    root = Path(root)
    graph = _graph(size, command)
    wanted = set(_dep_names(size))
    for stale in (root / "crates").glob("dep*"):
        if stale.name not in wanted:
            shutil.rmtree(stale)
    members = ", ".join(f'"{directory}"' for directory, _ in sorted(graph.values()))
    _write_if_changed(root / "Cargo.toml", _WORKSPACE.replace("MEMBERS", members))
    for name, (directory, _) in graph.items():
        manifest = _manifest(name, graph, command, size.third_party)
        _write_if_changed(root / directory / "Cargo.toml", manifest)
    for crate in range(size.deps):
        _write_dep(root, crate, size)
    _write_special(root, command, _dep_names(size), size.third_party)
    if size.third_party:
        _vendor_third_party(root)
    else:
        (root / ".cargo" / "config.toml").unlink(missing_ok=True)
        shutil.rmtree(root / "vendor", ignore_errors=True)
        _write_if_changed(root / "Cargo.lock", _lockfile(graph))
    return root


def _vendor_third_party(root: Path) -> None:
    """``vendor/`` (a cargo directory source) with every registry crate ``Cargo.lock``
    needs, copied from Debian's registry, and the lockfile resolved against it.

    The lockfile is resolved by cargo itself (offline, against Debian's registry)
    only when the current one does not fit the manifests, so that an unchanged
    project keeps its files and cargo's fingerprints.
    """
    _write_if_changed(root / ".cargo" / "config.toml", _CARGO_CONFIG)
    lock = root / "Cargo.lock"
    missing = [p for p in _registry_packages(lock) if not (root / "vendor" / p).is_dir()]
    if (
        lock.is_file()
        and not missing
        and _cargo_ok(root, ["metadata", "--locked", "--offline", "--format-version", "1"])
    ):
        return
    if not DEBIAN_REGISTRY.is_dir():
        raise RuntimeError(
            f"{DEBIAN_REGISTRY} is missing: the third-party crates are Debian's "
            f"(apt-get install {' '.join(DEBIAN_PACKAGES)})"
        )
    debian = f'source.vendored.directory="{DEBIAN_REGISTRY}"'
    if not _cargo_ok(root, ["generate-lockfile", "--offline", "--config", debian]):
        raise RuntimeError(
            f"cargo cannot resolve the third-party crates from {DEBIAN_REGISTRY}: "
            f"apt-get install {' '.join(DEBIAN_PACKAGES)}"
        )
    for package in _registry_packages(lock):
        if not (root / "vendor" / package).is_dir():
            shutil.copytree(DEBIAN_REGISTRY / package, root / "vendor" / package, symlinks=False)


def _registry_packages(lock: Path) -> list[str]:
    """``<name>-<version>`` of every crates.io package in a ``Cargo.lock``."""
    if not lock.is_file():
        return []
    blocks = lock.read_text(encoding="utf-8").split("[[package]]")
    found = []
    for block in blocks:
        name = re.search(r'^name = "([^"]+)"', block, re.M)
        version = re.search(r'^version = "([^"]+)"', block, re.M)
        if name and version and re.search(r"^source = \"registry\+", block, re.M):
            found.append(f"{name.group(1)}-{version.group(1)}")
    return found


def _cargo_ok(root: Path, args: list[str]) -> bool:
    done = subprocess.run(["cargo", *args], cwd=root, capture_output=True, text=True, check=False)
    return done.returncode == 0


def _header(abi: int) -> str:
    """The variant's header; it depends on ``abi`` alone (equal values, equal bytes)."""
    return (
        "/* torch_shim.h: the ABI a libtorch variant's shim is compiled for. */\n"
        "#ifndef FDL_TORCH_SHIM_H\n#define FDL_TORCH_SHIM_H\n"
        f"#define FDL_TORCH_ABI {abi}\n#endif\n"
    )


def add_libtorch(root: Path, arch: str, abi: int) -> Path:
    """``root/libtorch/<arch>``: the stub ``lib/libtorch.so`` (compiled once) and
    ``include/torch_shim.h`` defining ``FDL_TORCH_ABI`` as ``abi``; returns the arch dir."""
    arch_dir = add_variant(Path(root), arch)
    _write_if_changed(libtorch_dir(Path(root), arch) / "include" / "torch_shim.h", _header(abi))
    return arch_dir


def layout_variants(root: Path, variants: Mapping[str, int]) -> list[Path]:
    """:func:`add_libtorch` for each ``arch: abi``."""
    return [add_libtorch(root, arch, abi) for arch, abi in variants.items()]


# ---------------------------------------------------------------------------- timing and CLI


def time_cold_build(root: Path, arch: str, *, command: str = COMMAND) -> float:
    """Wall seconds of a cold native ``cargo build --release --features cuda`` of the
    binary against ``root/libtorch/<arch>``, in a fresh temporary target dir."""
    with tempfile.TemporaryDirectory(prefix="flodl-crate-target-") as target:
        env = {
            **os.environ,
            "LIBTORCH_PATH": str(libtorch_dir(Path(root), arch)),
            "CARGO_TARGET_DIR": target,
        }
        env.pop("RUSTC_WRAPPER", None)
        argv = ["cargo", "build", "--release", "--offline", "--locked", "--features", "cuda"]
        started = time.monotonic()
        done = subprocess.run(
            [*argv, "--bin", command],
            cwd=Path(root) / command,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"cargo build failed in {root}:\n{done.stderr[-3000:]}")
    return seconds


def _variant(text: str) -> tuple[str, int]:
    arch, sep, abi = text.rpartition("=")
    if not sep or not arch or not abi.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected ARCH=ABI (e.g. precompiled/cu128=2071), got {text!r}"
        )
    return arch, int(abi)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m bench.flodl_crate", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("dest", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="bench")
    for name in ("deps", "modules", "funcs", "kinds"):
        parser.add_argument(f"--{name}", type=int, help=f"override the size's {name}")
    parser.add_argument("--variant", type=_variant, action="append", default=[], metavar="ARCH=ABI")
    parser.add_argument("--time", metavar="ARCH", help="time a cold native build (needs ARCH)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    base = SIZES[args.size]
    size = Size(
        deps=args.deps or base.deps,
        modules=args.modules or base.modules,
        funcs=args.funcs or base.funcs,
        kinds=args.kinds or base.kinds,
        third_party=base.third_party,
    )
    generate(args.dest, size)
    layout_variants(args.dest, dict(args.variant))
    print(f"generated {COMMAND} ({size}) with {len(args.variant)} variant(s) in {args.dest}")
    if args.time:
        print(f"cold native release build: {time_cold_build(args.dest, args.time):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
