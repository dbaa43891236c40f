"""The truth the claim rule holds claims to (tests/simulation/claims.py): the world's ledger of the stores on
the simulated disks, read from real RocksDB stores in a temporary directory."""

from __future__ import annotations

from pathlib import Path

from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore
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
