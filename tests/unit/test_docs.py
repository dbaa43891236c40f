"""Every ``pipeline`` command written in the documentation is a valid command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipeline.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "topologies" / "README.md"]
BLOCK = re.compile(r"```(?:sh|bash|console)?\n(.*?)```", re.DOTALL)


def documented_commands() -> list[tuple[str, str]]:
    """(page, command line) for each ``pipeline`` command in a code block."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if re.match(r"^(\.venv/bin/)?pipeline ", command):
                    found.append((page.name, command))
    return found


def test_the_docs_contain_pipeline_commands() -> None:
    """The pages document the operator commands (this test would be empty otherwise)."""
    names = {shlex.split(c)[1] for _, c in documented_commands()}
    assert {"topics", "worker", "ingress", "produce", "tail", "inspect"} <= names


@pytest.mark.parametrize(("page", "command"), documented_commands())
def test_each_documented_command_parses(page: str, command: str) -> None:
    """The subcommand and every option in the docs exist in the CLI."""
    argv = shlex.split(command.replace("…", "x"))[1:]
    args = build_parser().parse_args(argv)
    assert args.handler is not None, page


def _table_rows(text: str) -> list[tuple[str, str]]:
    """(first cell, second cell) of each row of the markdown tables in ``text``."""
    rows = []
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) >= 4:
            rows.append((cells[1], cells[2]))
    return rows


def design_modules() -> dict[str, set[str]]:
    """The modules docs/design.md's layout (section 9) names, by package (``pipeline``, ``pipeline/worker``)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## 9. Layout")[1].split("## 10.")[0]
    named: dict[str, set[str]] = {}
    for first, what in _table_rows(section):
        base = "pipeline"
        for name in re.findall(r"`([^`]+)`", first):
            if name.endswith("/"):  # a package whose row names its modules
                base = name.rstrip("/")
                named.setdefault(base, set()).update(re.findall(r"`([a-z_]+)\.py`", what))
            elif "/" in name:
                base, _, module = name.rpartition("/")
                named.setdefault(base, set()).add(module.removesuffix(".py"))
            else:
                named.setdefault(base, set()).add(name.removesuffix(".py"))
    return named


def readme_layout() -> dict[str, set[str]]:
    """The modules (backticked names) the README's layout table gives each ``pipeline/`` row."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout")[1]
    layout = {}
    for first, what in _table_rows(section):
        path = first.strip().strip("`")
        if path.startswith("pipeline/"):
            layout[path.rstrip("/")] = set(re.findall(r"`([a-z_][a-z0-9_]*)`", what))
    return layout


def test_the_design_names_only_modules_that_exist() -> None:
    """Each module docs/design.md's layout names is a file of the package it is listed under."""
    for package, modules in design_modules().items():
        for module in modules:
            assert (ROOT / package / f"{module}.py").is_file(), f"design.md names {package}/{module}.py"


def test_the_readme_layout_agrees_with_the_design() -> None:
    """Each package row of the README's layout names exactly the modules design.md's layout lists for it."""
    design, readme = design_modules(), readme_layout()
    packages = {path.name for path in (ROOT / "pipeline").iterdir() if (path / "__init__.py").is_file()}
    assert {"pipeline", "pipeline/worker", "pipeline/state"} <= set(readme)
    for row, names in readme.items():
        if row == "pipeline":  # the top level: its modules; subpackages are named by their own rows
            wanted = design[row] - {"__init__", "__main__"}
            assert names - packages == wanted, (
                f"README pipeline/ row: {sorted(names - packages)} != {sorted(wanted)}"
            )
        else:  # a package's modules, and its subpackages (each with a design row of its own)
            subpackages = {path.name for path in (ROOT / row).iterdir() if (path / "__init__.py").is_file()}
            assert all(f"{row}/{sub}" in design for sub in subpackages), (
                f"design.md lacks a row of {row}'s packages"
            )
            assert names - subpackages == design.get(row, set()), (
                f"README {row}/ row: {sorted(names - subpackages)} != {sorted(design.get(row, set()))}"
            )


def test_the_docs_index_links_every_page() -> None:
    """docs/README.md links every page in docs/, so none is reachable only by chance."""
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", index))
    pages = {path.name for path in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages - linked == set(), f"docs/README.md does not link {sorted(pages - linked)}"
