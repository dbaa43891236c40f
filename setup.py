"""Build hook: compiles the worker's hot modules with mypyc (``pipeline/native.py`` lists them).

Everything else about the package is in ``pyproject.toml``. Build with
``PIPELINE_PURE_PYTHON=1`` to skip compiling (a machine without a C compiler): the
package then runs the same modules as Python, with the same behaviour.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent
NATIVE = runpy.run_path(str(HERE / "pipeline" / "native.py"))
# The build environment has none of the runtime dependencies: their types are Any here.
# Strictness is checked by `mypy` (scripts/test), not by the compile.
MYPY_FLAGS = ["--ignore-missing-imports", "--no-warn-return-any", "--no-warn-unused-ignores"]


def ext_modules() -> list[Any]:
    if os.environ.get(NATIVE["PURE_PYTHON_ENV"], "") == "1":
        return []
    from mypyc.build import mypycify  # noqa: PLC0415 (only a compiled build needs it)

    paths = [name.replace(".", "/") + ".py" for name in NATIVE["COMPILED"]]
    return mypycify([*MYPY_FLAGS, *paths], opt_level="3", debug_level="0", group_name="pipeline_native")


setup(ext_modules=ext_modules())
