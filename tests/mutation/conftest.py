"""The simulation seeds as pytest tests, collected only for a mutation run (``scripts/mutation``).

``MUTATION_SEEDS`` (comma-separated seeds) turns them on; unset, nothing here is collected, so
``scripts/test`` runs none of them (it runs the simulation itself, ``tests/simulation``).
"""

from __future__ import annotations

import os

import pytest

collect_ignore_glob = [] if os.environ.get("MUTATION_SEEDS") else ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The unit tests first, then the seeds: mutmut stops at the first failure, and a unit test
    costs milliseconds where a seed costs a second or more."""
    if os.environ.get("MUTATION_SEEDS"):
        items.sort(key=lambda item: item.nodeid.startswith("tests/mutation/"))
