"""When a task or standby entered its state: from its creation on, not only after its first move."""

from __future__ import annotations

import time

from pipeline.worker.lifecycle import Lifecycle, PartitionState, StandbyState


def test_a_new_lifecycle_records_when_it_entered_its_first_state() -> None:
    """A partition's and a standby's lifecycle are OPENING since the moment they were made."""
    before = time.monotonic()
    partition = Lifecycle.partition("raw-0")
    standby = Lifecycle.standby("raw-1")
    after = time.monotonic()
    assert (partition.state, standby.state) == (PartitionState.OPENING, StandbyState.OPENING)
    assert before <= partition.since <= after
    assert before <= standby.since <= after
