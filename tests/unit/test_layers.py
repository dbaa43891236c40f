"""The architecture's rules that an import can break: the pure logic loads no Kafka, no RocksDB, no HTTP,
and no module imports one that imports it back."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline

#: Modules of pure logic: the record contract, key extraction, the dedupe decision, sizes and names.
PURE = (
    "pipeline.contract",
    "pipeline.dead_letter",
    "pipeline.headers",
    "pipeline.topology",
    "pipeline.state.decision",
    "pipeline.kafka.partitioner",
    "pipeline.kafka.record_size",
    "pipeline.worker.classify",
    "pipeline.worker.assignment",
    "pipeline.providers.generic",
)
IO_LIBRARIES = ("aiokafka", "rocksdict", "aiohttp")


@pytest.mark.parametrize("module", PURE)
def test_pure_logic_imports_no_io_library(module: str) -> None:
    """Importing ``module`` in a fresh interpreter loads none of aiokafka, rocksdict and aiohttp."""
    code = f"import sys, {module}; print(','.join(m for m in {IO_LIBRARIES!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "", f"{module} loads {loaded.strip()}"


def _imports(root: Path) -> dict[str, set[str]]:
    """Each module of ``pipeline`` and the ``pipeline`` modules it imports, anywhere in it (typing-only too)."""
    files = {
        ".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): f
        for f in root.rglob("*.py")
    }
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, file in files.items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
                graph[name] |= {t if t in files else node.module for t in targets} & files.keys()
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names} & files.keys()
        graph[name].discard(name)
    return graph


def test_no_module_of_pipeline_imports_one_that_imports_it_back() -> None:
    """The modules' imports, typing-only ones included, form no circle (graphlib names one if they do)."""
    graph = _imports(Path(pipeline.__file__).resolve().parent)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"an import circle: {' -> '.join(exc.args[1])}")


def test_the_unit_tests_mirror_the_package() -> None:
    """Each folder of tests/unit/ is a subpackage of pipeline/: a unit test sits beside what it tests."""
    package = Path(pipeline.__file__).resolve().parent
    unit = Path(__file__).resolve().parent
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    assert folders <= subpackages, (
        f"tests/unit/ folders with no pipeline/ subpackage: {folders - subpackages}"
    )
