"""The package's layers: every import points down, and the top stays thin.

The order is the one ``docs/architecture.md`` draws. Imports under
``TYPE_CHECKING`` count too: a type from a higher layer is still an arrow up.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fdl_tasks"

#: From the bottom up; packages on one level may not import each other.
LEVELS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("gpu", "cargo"),
    ("config",),
    ("ssh",),
    ("timings",),
    ("tree",),
    ("cache",),
    ("build",),
    ("preflight",),
    ("publish",),
    ("watch",),
    ("api", "cli", "inv_process", "launch", "tasks", "__init__"),
)
LEVEL = {name: i for i, names in enumerate(LEVELS) for name in names}


def unit_of(module: str) -> str:
    """The package (or top-level module) a dotted ``fdl_tasks`` module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[dotted.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The ``fdl_tasks`` modules a file imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "fdl_tasks":
                continue
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                found.add(whole if whole in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "fdl_tasks"}
    return found


def below(target: str, source: str) -> bool:
    """Whether ``source`` may import ``target``: a lower level, or both at the top."""
    top = len(LEVELS) - 1
    return LEVEL[target] < LEVEL[source] or LEVEL[target] == LEVEL[source] == top


def arrows() -> list[tuple[str, str]]:
    known = modules()
    return [(m, target) for m, path in known.items() for target in sorted(imports(path, known))]


def test_every_package_has_a_level() -> None:
    units = {unit_of(m) for m in modules()}
    assert units <= set(LEVEL), f"not in LEVELS: {sorted(units - set(LEVEL))}"


def test_imports_point_down() -> None:
    upward = [
        f"{source} -> {target}"
        for source, target in arrows()
        if unit_of(source) != unit_of(target) and not below(unit_of(target), unit_of(source))
    ]
    assert upward == []


def test_launch_stays_off_the_build_path() -> None:
    """``inv launch`` runs what is published: it needs neither builds nor the pipeline."""
    launch = [t for s, t in arrows() if s == "fdl_tasks.launch"]
    assert [t for t in launch if t.startswith("fdl_tasks.build") or t.endswith(".pipeline")] == []


def test_the_architecture_page_draws_these_levels() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawn = re.search(r"```text\n(.*?)```", text, re.S)
    assert drawn is not None, "docs/architecture.md has no ```text diagram"
    rows = [re.findall(r"[\w]+/|[\w]+\.py", line) for line in drawn.group(1).splitlines()]
    rows = [[w.removesuffix("/").removesuffix(".py") for w in row] for row in rows if row]
    expected = [sorted(n for n in names if n != "__init__") for names in reversed(LEVELS)]
    assert [sorted(row) for row in rows] == expected


#: What only an I/O module may import (paramiko's key classes parse, they do no I/O).
IO_MODULES = {"subprocess", "socket", "fabric", "docker", "invoke", "shutil"}


def test_no_module_basename_twice_and_none_over_300_lines() -> None:
    paths = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    names = [p.name for p in paths]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert [str(p) for p in paths if len(p.read_text().splitlines()) > 300] == []


def test_the_pure_side_of_a_pair_does_no_io() -> None:
    """``<stem>.py`` beside ``<stem>_io.py`` is the pure side (docs/architecture.md)."""
    for io in PACKAGE.rglob("*_io.py"):
        pure = io.with_name(io.name.removesuffix("_io.py") + ".py")
        assert pure.exists(), f"{io.name} has no pure partner {pure.name}"
        tree = ast.parse(pure.read_text())
        used = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        used |= {
            n.module.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
        }
        assert not used & IO_MODULES, f"{pure.name} imports {sorted(used & IO_MODULES)}"
        assert "open(" not in pure.read_text(), f"{pure.name} opens files"
