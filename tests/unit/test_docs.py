"""README.md and docs/*.md held against the code: what they name must exist.

Each code block parses (YAML, Python); each cluster-file block loads with the
real loader and each ``fdl:`` block with the real settings; every ``inv``
command names a task of the collection with options that task has; every
option named alone is one of a task (or Invoke's, or another tool's, listed
below); docs/settings.md's settings table is the settings model, defaults
included, and its task table is the collection, both ways; every path in
this repository the docs name exists; every link to a page or heading
resolves.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from invoke.parser.argument import Argument
from invoke.program import Program

from fdl_tasks import ns
from fdl_tasks.cli import SHORT_FLAGS
from fdl_tasks.config.extras import with_extras
from fdl_tasks.config.flodl_schema import EXTRAS_FILE, project_problems
from fdl_tasks.config.loader import load_cluster, parse_cluster
from fdl_tasks.config.settings import DEFAULTS, Settings
from tests.unit.docs_text import (
    PAGES,
    ROOT,
    anchors,
    blocks,
    inv_lines,
    links,
    name,
    repo_paths,
    standalone_options,
    table_rows,
)

PAGE_IDS = [name(page) for page in PAGES]
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
CORE: dict[str, Argument] = {
    n: arg for arg in [*Program().core_args(), *Program().task_args()] for n in arg.names
}
#: Options of other programs the docs mention in inline code (cargo, rustc, docker, pytest,
#: the benchmarks, scripts/demo, dpkg, twine, ruff), each never taken for one of ours.
OTHER_TOOLS = {
    "--add-architecture", "--bin", "--bridge", "--check", "--crate-type", "--crates", "--down",
    "--env-file", "--epochs", "--features", "--filter", "--hosts", "--keep", "--mount", "--net",
    "--network", "--only", "--print", "--privileged", "--quick", "--release", "--reps", "--rm",
    "--strict", "--target", "--target-dir", "--user", "--volumes-from", "--window",
}  # fmt: skip


def options(task: str) -> dict[str, Argument]:
    """The task's options by every flag that names them (``--cmd`` and ``-c``)."""
    found = {}
    for arg in ns[task].get_arguments():
        for flag in arg.names:
            found[f"--{flag}" if len(flag) > 1 else f"-{flag}"] = arg
    return found


def every_option() -> set[str]:
    return {flag for task in ns.task_names for flag in options(task)}


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_code_blocks_parse(page: Path) -> None:
    for block in blocks(page):
        if block.lang == "yaml":
            assert list(yaml.safe_load_all(block.text)), block.text
        elif block.lang == "python":
            ast.parse(block.text, filename=name(page))


def _as_cluster(data: dict[str, Any]) -> dict[str, Any]:
    """A fragment (a ``controller:`` part, a ``workers:`` list) as a whole file."""
    inner = dict(data)
    inner["controller"] = {"path": "/srv/proj", **inner.get("controller", {})}
    inner.setdefault("workers", [])
    return inner


def _under_flodl_block(extras: dict[str, Any]) -> dict[str, Any]:
    """An ``fdl-tasks.yml`` block added onto a flodl block holding its workers' labels."""
    workers = [
        {"host": label, "path": "/srv/proj", "local_devices": [0], "nccl_socket_ifname": "lo"}
        for label in extras.get("workers") or {}
    ]
    controller = {"host": "10.0.0.1", "path": "/srv/proj", "docker": "cuda"}
    block = {"controller": controller, "workers": workers}
    return with_extras(block, extras, "fdl-tasks.yml", "fdl.cluster.yml")


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_cluster_and_settings_blocks_load(page: Path) -> None:
    """Every block in flodl's form passes flodl's own rules as it is; this tool's own
    form and ``fdl-tasks.yml`` blocks load."""
    for block in blocks(page):
        data = yaml.safe_load(block.text) if block.lang == "yaml" else None
        if not isinstance(data, dict):
            continue
        where = f"a block of {name(page)}"
        if "cluster" in data:
            assert project_problems(data) == [], block.text
            parse_cluster(data["cluster"], where)
        elif block.text.startswith(f"# {EXTRAS_FILE}"):
            parse_cluster(_under_flodl_block(data), where)
        elif {"controller", "workers"} & set(data):
            parse_cluster(_as_cluster(data), where)
        if "fdl" in data:
            Settings.from_config(data["fdl"])


def test_every_flodl_file_of_the_repository_passes_flodl_s_rules() -> None:
    """The repository's ``fdl.cluster.yml`` (the demo's) as flodl's loader reads it; its
    ``fdl-tasks.yml`` adds the rest."""
    data = yaml.safe_load((ROOT / "fdl.cluster.yml").read_text())
    assert project_problems(data) == []
    cluster = load_cluster(ROOT / "fdl.cluster.yml")
    assert cluster.origin is not None and cluster.origin.extras == str(ROOT / EXTRAS_FILE)
    assert "aarch64" in cluster.controller.cross


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_inv_commands_name_tasks_and_their_options(page: Path) -> None:
    for words in inv_lines(page):
        task, rest = _task_of(words[1:])
        if task is None or task.startswith("<"):
            continue
        task = task.removeprefix("fdl.")  # the collection nested as `fdl` (settings.md)
        assert task in ns.task_names, f"{name(page)}: {' '.join(words)}: no task {task!r}"
        known = options(task)
        skip = False
        for word in rest:
            if skip or not word.startswith("-"):
                skip = False
                continue
            flag = word.split("=")[0]
            arg = known.get(flag) or CORE.get(flag.lstrip("-"))
            assert arg is not None, f"{name(page)}: {' '.join(words)}: {task} has no {flag}"
            skip = arg.kind is not bool and "=" not in word and flag not in ("--help", "-h")


def _task_of(words: list[str]) -> tuple[str | None, list[str]]:
    """The task word of ``inv``'s arguments (after Invoke's own options) and what follows."""
    skip = False
    for n, word in enumerate(words):
        if skip:
            skip = False
        elif word.startswith("-"):
            arg = CORE.get(word.lstrip("-").split("=")[0])
            assert arg is not None, f"inv {' '.join(words)}: Invoke has no {word}"
            skip = arg.kind is not bool and arg.name not in ("help", "list") and "=" not in word
        else:
            return word, words[n + 1 :]
    return None, []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_options_named_alone_exist(page: Path) -> None:
    ours = every_option() | {f"--{flag}" for flag in CORE if len(flag) > 1}
    for option in standalone_options(page):
        assert option in ours | OTHER_TOOLS, f"{name(page)}: `{option}` is no option of ours"
        assert not (option in ours and option in OTHER_TOOLS), f"{option} is ours now"


def _default(text: str) -> str:
    return text.strip("`").replace('""', "")


def test_the_settings_table_is_the_settings_model() -> None:
    documented: dict[str, str] = {}
    for row in table_rows(SETTINGS_PAGE, "| setting | default |"):
        names = [cell.strip("` ") for cell in row[0].split(",")]
        defaults = [cell.strip() for cell in row[1].split(",")]
        assert len(defaults) == len(names), row
        documented |= {n: _default(d) for n, d in zip(names, defaults, strict=True)}
    fields = {field.name: field.default for field in attrs.fields(Settings)}
    assert sorted(documented) == sorted(fields), "settings.md's table and Settings differ"
    for setting, default in fields.items():
        shown = documented[setting]
        if isinstance(default, bool):
            assert shown == str(default).lower(), setting
        elif isinstance(default, int | float):
            assert float(shown) == default, setting
        elif isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            assert shown == repr(DEFAULTS[setting]), setting
        else:
            assert shown == default, setting
    for row in table_rows(SETTINGS_PAGE, "| setting | default |"):
        for flag in re.findall(r"`(-[^`]+)`", row[2]):
            assert flag in every_option(), row


def test_the_task_table_is_the_collection() -> None:
    rows = {row[0].strip("`"): row[1] for row in table_rows(SETTINGS_PAGE, "| task | options |")}
    assert sorted(rows) == sorted(ns.task_names)
    for task, cell in rows.items():
        named = {
            flag for flag in re.findall(r"`(-[^`]+)`", cell.replace("`/`", "` `")) if flag != "--"
        }
        known = options(task)
        assert named <= set(known), f"{task}: {sorted(named - set(known))}"
        every = {arg.name for arg in ns[task].get_arguments()}
        listed = {known[flag].name for flag in named}
        assert every <= listed, f"settings.md does not list {task}'s {sorted(every - listed)}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_paths_in_this_repository_exist(page: Path) -> None:
    for path in repo_paths(page):
        file, _, test = path.partition("::")
        assert (ROOT / file).exists(), f"{name(page)} names {path}, which does not exist"
        if test:
            assert f"def {test}(" in (ROOT / file).read_text(), f"{name(page)}: {path}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_links_to_pages_and_headings_resolve(page: Path) -> None:
    for link in links(page):
        target, _, anchor = link.partition("#")
        if "://" in target:
            continue
        linked = (page.parent / target).resolve() if target else page
        assert linked.exists(), f"{name(page)}: ({link}) names no file"
        if anchor:
            assert anchor in anchors(linked), f"{name(page)}: ({link}) names no heading"


def test_the_module_tables_are_the_package() -> None:
    """docs/architecture.md names every module of fdl_tasks, and only modules that exist."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = re.findall(r"`(?:fdl_tasks/)?([\w/]*\w+\.py)`", text)
    named = {path.rsplit("/", 1)[-1] for path in paths if not path.startswith("tests/")}
    files = {p.name for p in (ROOT / "fdl_tasks").rglob("*.py") if p.name != "__init__.py"}
    assert not named - files, f"docs/architecture.md names no module {sorted(named - files)}"
    assert not files - named, f"docs/architecture.md names no {sorted(files - named)}"


def test_pages_the_code_and_config_name_exist() -> None:
    """A comment or docstring pointing at ``docs/<page>.md`` points at a page that exists."""
    sources = [ROOT / name for name in ("invoke.yaml", "cluster.yaml", "fdl.cluster.yml")]
    for top in ("fdl_tasks", "rig", "tests", "bench", "scripts"):
        found = (ROOT / top).rglob("*")
        sources += [p for p in found if p.suffix in ("", ".py") and "target" not in p.parts]
    sources = [source for source in sources if source.is_file()]
    for source in sources:
        for page in re.findall(r"docs/[\w-]+\.md", source.read_text(errors="replace")):
            assert (ROOT / page).exists(), f"{name(source)} names {page}, which does not exist"


def test_the_short_flags_table_is_the_code() -> None:
    rows = table_rows(SETTINGS_PAGE, "| short | long |")
    documented = {row[1].strip("`").removeprefix("--"): row[0].strip("`-") for row in rows}
    assert documented == SHORT_FLAGS


def test_the_task_lists_are_the_collection() -> None:
    """README's ``inv --list`` comment and compose.md's ``ns`` row name every task."""
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"^inv --list +# (.+)$", readme, re.M)
    assert listed is not None
    assert sorted(listed.group(1).split(", ")) == sorted(ns.task_names)
    row = next(r for r in table_rows(ROOT / "docs" / "compose.md", "| name |") if r[0] == "`ns`")
    assert sorted(re.findall(r"`([\w-]+)`", row[1])) == sorted(ns.task_names)
