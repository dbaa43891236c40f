"""The simulation can fail: each defect it was built for, put back into a copy of pipeline/, fails its seed.

The same seeds pass on the code as it is (they are among the 500 test_simulation runs).
docs/reliability.md has the table; tests/simulation/defects.py the patches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulation.defects import DEFECTS, make_copy, run_with_defect

CASES = [
    (1, 0, "livelock"),  # refused outputs: abort, isolate, DLQ, refused again, forever
    (2, 0, "stripe:evt_0_19: 2 commands, expected 1"),  # one record dated ahead expires the seen-set
    (3, 5, "stripe:evt_5_20: 0 commands, expected 1"),  # a store ahead of its changelog trusted
    (4, 17, "sim.raw-0@6 (s34): 2 audit records, expected 1"),  # a zombie's offsets without its generation
    (6, 29, "as larger than its max.message.bytes"),  # batches larger than the topic takes
    (7, 22, "sim.raw-0@3 (s3): 2 audit records, expected 1"),  # offsets read while a transaction holds them
    (8, 6, "stripe:evt_6_8: 2 commands, expected 1"),  # a store restored only to the last stable offset
]


@pytest.mark.parametrize(
    ("defect", "seed", "problem"), CASES, ids=[f"defect-{d}-seed-{s}" for d, s, _ in CASES]
)
def test_the_defect_put_back_fails_its_seed(defect: int, seed: int, problem: str) -> None:
    """With the fix undone in a copy of pipeline/, the recorded seed fails, and for the recorded reason."""
    result = run_with_defect(defect, ["--seed", str(seed)], timeout=300)
    assert result.returncode == 1, result.stdout[:3000] + result.stderr[-2000:]
    assert problem in result.stdout, result.stdout[:3000]


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_patch_still_finds_the_fix_it_undoes(defect: int, tmp_path: Path) -> None:
    """Every defect patch applies to pipeline/ as it is: a reworded fix fails here in a second, not after a run."""
    make_copy(defect, tmp_path)
