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
