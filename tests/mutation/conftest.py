"""The simulation seeds as pytest tests, collected only for a mutation run (``scripts/mutation``).

``MUTATION_SEEDS`` (comma-separated seeds) turns them on; unset, nothing here is collected, so
``scripts/test`` runs none of them (it runs the simulation itself, ``tests/simulation``).
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("MUTATION_SEEDS") else ["test_*.py"]
