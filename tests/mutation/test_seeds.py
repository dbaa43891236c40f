"""One simulation seed per test, for the mutation tool to select per mutant (``scripts/mutation``)."""

from __future__ import annotations

import os

import pytest

from tests.simulation.world import run_seed

MIX = os.environ.get("MUTATION_MIX", "default")
SEEDS = [int(seed) for seed in os.environ.get("MUTATION_SEEDS", "").split(",") if seed.strip()]


@pytest.mark.parametrize("seed", SEEDS)
def test_seed(seed: int) -> None:
    """The seed (of ``MUTATION_MIX``) holds every property of the simulation's oracle (docs/reliability.md)."""
    result = run_seed(seed, MIX)
    assert result.ok, result.report(trace_lines=40)
