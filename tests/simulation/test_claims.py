"""The truth the claim rule holds claims to (tests/simulation/claims.py): the world's ledger of the stores on
the simulated disks, read from real RocksDB stores in a temporary directory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from pipeline.state import directory
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore
from pipeline.worker.assignor import Held
from tests.simulation.claims import ClaimCheck
from tests.simulation.faults import SimStore, StoreLedger

BUCKET_MS = 3_600_000


def _write(store: PartitionStore, offset: int) -> None:
    entry = Entry(0, BUCKET_MS, 0, 0, 0, 0, "handle", "commands", None, 0)
    store.write({b"k": Change.of(entry)}, changelog_offset=offset, stream_time=0)


def _ledgered(tmp_path: Path) -> tuple[StoreLedger, Path]:
    ledger = StoreLedger()
    SimStore.ledger = ledger
    return ledger, tmp_path / "sim.raw-0"


def test_an_open_store_holds_its_live_offset_and_a_closed_one_what_it_held_when_closed(
    tmp_path: Path,
) -> None:
    """While open, the ledger follows the store's writes; once closed, it keeps the offset it was closed at."""
    ledger, path = _ledgered(tmp_path)
    try:
        store = SimStore.open(path, bucket_ms=BUCKET_MS)
        _write(store, 7)
        assert ledger.holds(path) == 7
        _write(store, 12)
        store.close()
        assert ledger.holds(path) == 12
    finally:
        SimStore.ledger = None


def test_a_wiped_store_holds_nothing_and_an_unseen_one_is_not_known(tmp_path: Path) -> None:
    """A store removed from disk holds -1 whatever it held; a store the world never saw opened is None (not judged)."""
    ledger, path = _ledgered(tmp_path)
    try:
        store = SimStore.open(path, bucket_ms=BUCKET_MS)
        _write(store, 3)
        store.close()
        PartitionStore.wipe(path)
        assert ledger.holds(path) == -1
        SimStore.ledger = None
        other = tmp_path / "sim.raw-1"
        unseen = SimStore.open(other, bucket_ms=BUCKET_MS)
        unseen.close()
        assert ledger.holds(other) is None
    finally:
        SimStore.ledger = None


def _world(log_end: int) -> Any:
    """A world whose input sim.raw has changelog sim-seen-changelog, its partition 0 ending at ``log_end``."""
    log = SimpleNamespace(end=log_end)
    broker = SimpleNamespace(log=lambda topic, partition: log if topic == "sim-seen-changelog" else None)
    return SimpleNamespace(broker=broker, changelog_of=lambda: {"sim.raw": "sim-seen-changelog"})


def test_the_stores_found_at_start_inside_their_changelog_must_be_claimed_in_the_first_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store found at start at offset 5 of a changelog ending at 6 is expected in the first claim: a claim
    without it is a problem, one with it is not; a store at the end (6) is not expected."""
    ledger, path = _ledgered(tmp_path)
    try:
        store = SimStore.open(path, bucket_ms=BUCKET_MS)
        _write(store, 5)
        store.close()
    finally:
        SimStore.ledger = None
    monkeypatch.setattr(directory, "store_path", lambda *_args: path)
    check = ClaimCheck(_world(6), ledger)
    changelog, tp = TopicPartition("sim-seen-changelog", 0), TopicPartition("sim.raw", 0)
    assert check.inside({changelog: 5}) == {tp: 5}
    assert check.inside({changelog: 6}) == {}
    replicas: Any = SimpleNamespace(
        settings=SimpleNamespace(state_dir=tmp_path, group="sim"), context=SimpleNamespace(topology=None)
    )
    check._scanned["?"] = {tp: 5}
    check.judge(replicas, Held({}, frozenset()))
    assert len(check.problems) == 1
    assert "found its store of sim.raw-0 at changelog offset 5 at start" in check.problems[0]
    check._scanned["?"] = {tp: 5}
    check.judge(replicas, Held({tp: 5}, frozenset()))
    assert len(check.problems) == 1  # claimed: no second problem
