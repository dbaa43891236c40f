"""Which build of the hot modules (``pipeline.native.COMPILED``) the tests load.

By default the compiled one that ``scripts/bootstrap`` builds; with
``PIPELINE_PURE_PYTHON=1`` their Python sources instead, so that one suite
covers both (``scripts/test`` runs the unit tests once more that way). A
compiled module older than its source (an edit since the last build) stops
the run: the tests would otherwise run the old code.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pipeline.native import COMPILED, PURE_PYTHON_ENV


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds a hot module's ``.py`` before the compiled extension beside it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED or path is None:
            return None
        for entry in path:
            source = Path(entry) / f"{fullname.rpartition('.')[2]}.py"
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def pure_python_asked() -> bool:
    """Whether this run tests the sources of the hot modules."""
    return os.environ.get(PURE_PYTHON_ENV, "") == "1"


def load_sources_if_asked() -> None:
    """Make the hot modules import from their sources when ``PIPELINE_PURE_PYTHON=1``.

    Must run before anything imports them.
    """
    loaded = [name for name in COMPILED if name in sys.modules]
    if loaded:
        raise RuntimeError(f"imported before the test build was chosen: {loaded}")
    if pure_python_asked() and not any(isinstance(f, _SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesFirst())
