"""The hot modules' compiled build (mypyc) behaves as their Python sources do."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pipeline import native
from tests.native_source import pure_python_asked

ROOT = Path(__file__).resolve().parents[2]


def _workload(*, pure: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
    if pure:
        env[native.PURE_PYTHON_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.native_workload"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = orjson.loads(done.stdout.splitlines()[-1])
    return result


def test_this_run_loads_the_build_it_names() -> None:
    """Every hot module is the compiled extension, or with PIPELINE_PURE_PYTHON=1 its Python source."""
    for name in native.COMPILED:
        __import__(name)
        loaded = sys.modules[name].__file__ or ""
        assert loaded.endswith(".py") is pure_python_asked(), f"{name} loaded from {loaded}"


def test_the_compiled_and_the_pure_python_builds_commit_the_same_records_and_state() -> None:
    """One mix of records (firsts, duplicates, a conflict, reroutes, DLQ cases) gives byte-identical outputs and store."""
    if pure_python_asked():
        pytest.skip("the sources-only run: the compiled build is compared in the default run")
    compiled, pure = _workload(pure=False), _workload(pure=True)
    assert compiled["compiled"] == list(native.COMPILED)
    assert pure["compiled"] == []
    assert compiled["outcomes"] == {"conflict": 1, "duplicate": 10, "first": 33, "invalid": 3, "rerouted": 3}
    assert compiled["committed_offset"] == 50
    assert compiled["sha256"] == pure["sha256"]
    assert compiled == {**pure, "compiled": compiled["compiled"]}


def test_the_build_reads_the_list_of_hot_modules_from_pipeline_native() -> None:
    """setup.py compiles exactly native.COMPILED, each an existing module of the package."""
    setup = (ROOT / "setup.py").read_text()
    assert 'runpy.run_path(str(HERE / "pipeline" / "native.py"))' in setup
    assert 'NATIVE["COMPILED"]' in setup
    for name in native.COMPILED:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_describe_names_the_modules_that_run_as_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's start line says how many hot modules are compiled, and which are not."""
    monkeypatch.setattr(native, "is_compiled", lambda name: name != "pipeline.worker.emitter")
    assert native.describe() == (
        f"hot modules compiled (mypyc): {len(native.COMPILED) - 1} of {len(native.COMPILED)}; "
        "pure Python: pipeline.worker.emitter"
    )
    monkeypatch.setattr(native, "is_compiled", lambda _name: False)
    assert native.describe().startswith("hot modules in pure Python")


def test_a_compiled_module_whose_source_was_edited_after_the_build_is_stale(tmp_path: Path) -> None:
    """A source newer than its compiled file by more than STALE_AFTER_S is reported; one written with it is not."""
    name = "pipeline.worker.emitter"
    built = tmp_path / "emitter.cpython-311-x86_64-linux-gnu.so"
    built.write_bytes(b"")
    source = tmp_path / "emitter.py"
    source.write_text("")
    loader = importlib.machinery.ExtensionFileLoader(name, str(built))
    spec = importlib.util.spec_from_file_location(name, built, loader=loader)

    def find(module: str) -> importlib.machinery.ModuleSpec | None:
        return spec if module == name else None

    at = built.stat().st_mtime
    os.utime(source, (at + 1, at + 1))  # as an installer writes them
    assert native.stale(find) == []
    os.utime(source, (at + native.STALE_AFTER_S + 60, at + native.STALE_AFTER_S + 60))  # edited later
    assert native.stale(find) == [name]


def test_a_compiled_file_removed_after_its_import_is_not_reported_and_does_not_raise(tmp_path: Path) -> None:
    """The start-up check skips a module whose compiled file is gone (removed by hand) instead of crashing."""
    name = "pipeline.worker.emitter"
    built = tmp_path / "emitter.cpython-311-x86_64-linux-gnu.so"
    (tmp_path / "emitter.py").write_text("")
    loader = importlib.machinery.ExtensionFileLoader(name, str(built))
    spec = importlib.util.spec_from_file_location(name, built, loader=loader)

    def find(module: str) -> importlib.machinery.ModuleSpec | None:
        return spec if module == name else None

    assert native.stale(find) == []
