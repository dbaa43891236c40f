"""The hot modules of the worker and the ingress, compiled with mypyc when the package is built, and how to tell.

``setup.py`` reads :data:`COMPILED` from this file (without importing the package) and
compiles those modules into C extensions beside their sources, unless the build runs
with ``PIPELINE_PURE_PYTHON=1``. The sources stay in the package: a build without a
C compiler, or with the variable set, gives the same behaviour in pure Python, and the
test suite runs both (``scripts/test``).

This module imports nothing from the package, so that the build can read it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Final

#: Per record, the worker spends most of its own CPU in these (``bench/hotpath.py``); per request,
#: the ingress in the providers' body, header and signature modules (``bench/ingress_bench.py``).
COMPILED: Final = (
    "pipeline.contract",
    "pipeline.kafka.partitioner",
    "pipeline.providers._body",
    "pipeline.providers._headers",
    "pipeline.providers._hmac",
    "pipeline.providers._verify_body",
    "pipeline.providers._verify_standard",
    "pipeline.providers._verify_timestamped",
    "pipeline.state.decision",
    "pipeline.state.transaction",
    "pipeline.worker.classify",
    "pipeline.worker.emitter",
    "pipeline.worker.event_stage",
)

#: Set at build time to skip compiling (no C compiler), and in tests to load the sources.
PURE_PYTHON_ENV: Final = "PIPELINE_PURE_PYTHON"
#: A source this much newer than its compiled file was edited after the build (an
#: installer writes both within moments of each other).
STALE_AFTER_S: Final = 2.0


Finder = Callable[[str], ModuleSpec | None]


def _extension(module: str, find: Finder) -> Path | None:
    """The compiled file importing ``module`` loads, or None for a source (finding it imports its parents)."""
    spec = find(module)
    if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        return None
    return Path(str(spec.origin))


def is_compiled(module: str) -> bool:
    """Whether importing ``module`` loads a compiled extension (finding it imports its parent packages)."""
    return _extension(module, importlib.util.find_spec) is not None


def describe() -> str:
    """One line for the worker's start: which of the hot modules run compiled."""
    compiled = [name for name in COMPILED if is_compiled(name)]
    if len(compiled) == len(COMPILED):
        return f"hot modules compiled (mypyc): {len(compiled)} of {len(COMPILED)}"
    if not compiled:
        return f"hot modules in pure Python (built with {PURE_PYTHON_ENV}=1, or no compiled build)"
    missing = sorted(set(COMPILED) - set(compiled))
    return (
        f"hot modules compiled (mypyc): {len(compiled)} of {len(COMPILED)}; pure Python: {', '.join(missing)}"
    )


def stale(find: Finder = importlib.util.find_spec) -> list[str]:
    """Compiled hot modules whose source beside them changed after the build (an edited editable install).

    Those run the code as it was built, not as the source reads: ``scripts/bootstrap``
    compiles them again.
    """
    found = []
    for name in COMPILED:
        built = _extension(name, find)
        if built is None:
            continue
        source = built.parent / f"{name.rpartition('.')[2]}.py"
        try:
            if source.stat().st_mtime > built.stat().st_mtime + STALE_AFTER_S:
                found.append(name)
        except FileNotFoundError:  # no source beside it, or the compiled file removed since the import
            continue
    return found
