"""The rule that no store is found corrupt (``faults.StoreLedger.corrupt``), on real RocksDB stores in a temporary
directory: nothing in a run corrupts one, so a store its own code cannot read back is a problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import StoreCorruptError, StoreStaleError
from pipeline.state.decision import Entry
from pipeline.state.store import Change
from tests.simulation.faults import SimStore, StoreLedger

BUCKET_MS = 3_600_000


@pytest.fixture
def ledger() -> object:
    found = StoreLedger()
    SimStore.ledger = found
    yield found
    SimStore.ledger = None


def test_a_store_reopened_whole_is_no_problem(tmp_path: Path, ledger: StoreLedger) -> None:
    """A store written, closed and opened again, then read: nothing is reported."""
    store = SimStore.open(tmp_path / "s", bucket_ms=BUCKET_MS)
    store.write({b"k": Change.of(Entry(0, BUCKET_MS, 0, 0))}, changelog_offset=0, stream_time=0)
    store.close()
    again = SimStore.open(tmp_path / "s", bucket_ms=BUCKET_MS)
    assert set(again.get_many([b"k"])) == {b"k"}
    again.close()
    assert ledger.corrupt == []


def test_a_store_whose_metadata_its_code_cannot_read_is_reported_and_still_raised(
    tmp_path: Path, ledger: StoreLedger
) -> None:
    """A bucket width written as a float (the mutant that found the rule): the reopen raises StoreCorruptError,
    as the worker expects, and the ledger names the store."""
    store = SimStore.open(tmp_path / "s", bucket_ms=60_480_000.0)  # a float, as the mutant wrote it
    store.write({b"k": Change.of(Entry(0, BUCKET_MS, 0, 0))}, changelog_offset=0, stream_time=0)
    store.close()
    with pytest.raises(StoreCorruptError):
        SimStore.open(tmp_path / "s", bucket_ms=60_480_000)
    assert len(ledger.corrupt) == 1
    assert "unreadable metadata" in ledger.corrupt[0]
    assert ledger.corrupt[0].endswith("(s)")


def test_an_entry_that_cannot_be_decoded_is_reported_as_it_is_read(
    tmp_path: Path, ledger: StoreLedger
) -> None:
    """An entry's bytes overwritten with garbage in its bucket: the read raises StoreCorruptError and is reported."""
    store = SimStore.open(tmp_path / "s", bucket_ms=BUCKET_MS)
    store.write({b"k": Change.of(Entry(0, BUCKET_MS, 0, 0))}, changelog_offset=0, stream_time=0)
    for family in store._buckets.values():
        family.put(b"k", b"\x00garbage")  # what a disk that lost bits would hand back
    with pytest.raises(StoreCorruptError):
        store.get_many([b"k"])
    store.close()
    assert len(ledger.corrupt) == 1


def test_a_store_of_another_log_is_left_to_the_stale_rule(tmp_path: Path, ledger: StoreLedger) -> None:
    """StoreStaleError is a StoreCorruptError, but a foreign store is whole: the ledger reports nothing of it."""
    ledger.found_corrupt(tmp_path / "s", StoreStaleError("store s caches changelog c of cluster other"))
    assert ledger.corrupt == []
