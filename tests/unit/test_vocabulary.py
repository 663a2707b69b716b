"""docs/architecture.md's vocabulary held against the code: one word, one thing.

Each row of "The vocabulary" names a word and the module(s) holding it. The
table is a checked fact, not a wish:

- every module a row names is one module of the package (``backends/<mode>.py``
  at least one), every identifier it names (``variants.py`` (``libtorch_dir``),
  ``model.Cluster.source``, ``Backend.toolchain``) is defined where it says;
- a word's class (``build environment`` → ``BuildEnvironment``: a class or a
  type alias of that name) is defined in one module only, and in a module its
  row names: a second class under a table word's name, anywhere in the package,
  is a second meaning and fails here;
- no word has two rows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import attrs
import pytest

from tests.unit.docs_text import ROOT, table_rows

PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "fdl_tasks"
#: Type names two modules define, each with why; any other is a second meaning of a word.
SHARED_TYPE_NAMES: dict[str, str] = {
    "Answers": "gpu_probe's Protocol is ssh.answers' class as the gpu layer, below it, sees it"
}

_MODULE = re.compile(r"`([\w/<>]+\.py)`(?:\s*\(([^)]*)\))?")
_CODE = re.compile(r"`([^`]+)`")


@attrs.frozen
class Package:
    """The package's modules, parsed, by path from the repository root."""

    trees: Mapping[str, ast.Module]

    @classmethod
    def read(cls) -> Package:
        paths = sorted(PACKAGE.rglob("*.py"))
        return cls({_relative(p): ast.parse(p.read_text(), str(p)) for p in paths})

    def with_module(self, name: str, source: str) -> Package:
        """This package with module ``name`` added, or replaced by ``source``."""
        return Package({**self.trees, name: ast.parse(source, name)})

    def top_names(self, name: str) -> set[str]:
        """What a module defines at its top level: classes, functions, assigned names."""
        names: set[str] = set()
        for node in self.trees[name].body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                targets = [
                    e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
                ]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        return names

    def types(self, name: str) -> set[str]:
        """The classes and type aliases a module defines (a capitalised name, no CONSTANT)."""
        return {n for n in self.top_names(name) if n[0].isupper() and not n.isupper()}

    def members(self, name: str, cls: str) -> set[str]:
        """The methods and attributes class ``cls`` of a module defines."""
        for node in self.trees[name].body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                found = set()
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        found.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        found.add(item.target.id)
                return found
        return set()

    def resolve(self, named: str) -> list[str]:
        """The modules a table names: ``names.py`` or ``backends/registry.py`` by the end
        of their path; ``backends/<mode>.py`` every module of that directory."""
        pattern = re.sub(r"<[^>]*>", "[^/]+", named.replace(".", r"\."))
        return [m for m in self.trees if re.fullmatch(rf"(?:.*/)?{pattern}", m)]


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def words(cell: str) -> list[str]:
    """A row's words: ``variant (arch)`` is two names of one thing, as are comma lists."""
    return [w.strip() for w in re.split(r"[,()]", cell) if w.strip()]


def class_name(word: str) -> str:
    """``build environment`` → ``BuildEnvironment``; ``controller ABI`` → ``ControllerAbi``."""
    return "".join(part.capitalize() for part in re.split(r"[\s-]+", word))


def problems(rows: list[list[str]], package: Package) -> Iterator[str]:
    """Every way the table and the package disagree (none: the table is true)."""
    seen: dict[str, int] = {}
    for number, (cell, _meaning, where) in enumerate(rows, 1):
        row = f"row {number} ({cell})"
        listed: set[str] = set()
        for match in _MODULE.finditer(where):
            named, inside = match.group(1), match.group(2) or ""
            found = package.resolve(named)
            if not found or ("<" not in named and len(found) > 1):
                yield f"{row}: `{named}` is {len(found)} modules, not one"
                continue
            listed |= set(found)
            for ident in _CODE.findall(inside):
                if not any(ident in package.top_names(m) for m in found):
                    yield f"{row}: `{named}` defines no `{ident}`"
        for ref in _CODE.findall(_MODULE.sub("", where)):
            yield from _member_problems(row, ref, package, listed)
        for word in words(cell):
            if word.lower() in seen:
                yield f"{row}: {word!r} already has row {seen[word.lower()]}"
            seen[word.lower()] = number
            name = class_name(word)
            defining = {m for m in package.trees if name in package.types(m)}
            if len(defining) > 1:
                yield f"{row}: {word!r} names {len(defining)} classes {name}: " + ", ".join(
                    sorted(defining)
                )
            for module in sorted(defining - listed):
                yield f"{row}: {word!r} is class {name} of {module}, which the row does not list"


def _member_problems(row: str, ref: str, package: Package, listed: set[str]) -> Iterator[str]:
    """``model.Cluster.source``, ``model.FlodlOrigin`` or ``Backend.toolchain``: its
    module (named, else the one defining the class) must define it; it is listed."""
    *owner, member = ref.split(".")
    if not owner:
        yield f"{row}: `{ref}` names neither a module nor a member"
        return
    by_module = owner[0].islower()
    modules = (
        package.resolve(f"{owner[0]}.py")
        if by_module
        else [m for m in package.trees if owner[0] in package.types(m)]
    )
    classes = owner[1:] if by_module else owner
    if len(modules) != 1:
        yield f"{row}: `{ref}`'s owner is {len(modules)} modules, not one"
        return
    module = modules[0]
    listed.add(module)
    if classes and member not in package.members(module, classes[0]):
        yield f"{row}: `{ref}`: {module} has no {classes[0]}.{member}"
    elif not classes and member not in package.top_names(module):
        yield f"{row}: `{ref}`: {module} defines no {member}"


def vocabulary() -> list[list[str]]:
    """The vocabulary table's rows: word, meaning, module."""
    rows = table_rows(PAGE, "## The vocabulary")
    assert rows and all(len(row) == 3 for row in rows), "word | meaning | module"
    return rows


@cache
def real_package() -> Package:
    return Package.read()


def test_the_vocabulary_is_the_package() -> None:
    assert list(problems(vocabulary(), real_package())) == []


def test_no_type_name_is_defined_twice() -> None:
    """A class (or type alias) name in two modules is one word for two things, table
    word or not (``Kind`` was a failure's and a change's): only the listed ones share."""
    package = real_package()
    modules: dict[str, list[str]] = {}
    for module in package.trees:
        for name in package.types(module):
            modules.setdefault(name, []).append(module)
    shared = {name: where for name, where in modules.items() if len(where) > 1}
    assert sorted(shared) == sorted(SHARED_TYPE_NAMES), shared


#: The probe's controller side as it was: a second BuildEnvironment.
OLD_PROBE_CLASS = """
@attrs.frozen
class BuildEnvironment:
    cpu_arch: str
    glibc: tuple[int, int] | None
    cross: frozenset[str] = frozenset()
"""


@pytest.mark.parametrize(
    ("module", "was", "added", "expected"),
    [
        (
            "fdl_tasks/preflight/probe.py",
            "",
            OLD_PROBE_CLASS,
            [
                "'build environment' names 2 classes BuildEnvironment: "
                "fdl_tasks/build/build_environment.py, fdl_tasks/preflight/probe.py",
                "'build environment' is class BuildEnvironment of fdl_tasks/preflight/probe.py",
            ],
        ),
        # Verification's result as it was: a class Delivery beside it.
        (
            "fdl_tasks/publish/verification_io.py",
            "",
            "class Delivery:\n    pass",
            ["'delivery' is class Delivery of fdl_tasks/publish/verification_io.py"],
        ),
        (
            "fdl_tasks/gpu/gpus.py",
            "",
            "Backend = tuple[int, int]",
            ["'backend' names 2 classes Backend", "is class Backend of fdl_tasks/gpu/gpus.py"],
        ),
    ],
)
def test_a_second_class_under_a_word_fails(
    module: str, was: str, added: str, expected: list[str]
) -> None:
    """The check can fail: a word's class (or type alias) defined a second time, in a
    module its row does not name, is reported."""
    package = real_package()
    source = ast.unparse(package.trees[module])
    assert was in source
    source = source.replace(was, added) if was else source + "\n" + added
    found = list(problems(vocabulary(), package.with_module(module, source)))
    for line in expected:
        assert any(line in problem for problem in found), found


def test_a_row_naming_what_is_not_there_fails() -> None:
    """A row naming a module or an identifier the package lacks is reported, not skipped."""
    rows = [
        ["lock", "m", "`locks.py` (`NoSuchLock`)"],
        ["stray", "m", "`no_such_module.py`, `layout.py`"],
        ["reporter", "m", "`model.Cluster.nowhere`"],
        ["flodl env", "m", "`model.FlodlOrigin`, `Backend.toolchain`"],
        ["env", "m", "`reporting.py`"],
        ["Env", "m", "`reporting.py`"],
        ["shared", "m", "`__init__.py`"],
    ]
    found = list(problems(rows, real_package()))
    assert any("defines no `NoSuchLock`" in line for line in found), found
    assert any("`no_such_module.py` is 0 modules" in line for line in found), found
    assert any("has no Cluster.nowhere" in line for line in found), found
    assert any("'Env' already has row 5" in line for line in found), found
    assert any("`__init__.py` is " in line for line in found), found
    assert not any("FlodlOrigin" in line or "toolchain" in line for line in found), found
