"""A partition's part of the worker's transaction: what it stages, how it sizes and stamps its records, and what
it reports after the commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.errors import RecordTooLargeError
from pipeline.kafka.record_size import RECORD_OVERHEAD, record_size
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore
from pipeline.state.transaction import Header, PartCommitted
from tests.unit.state.test_transaction import HOUR, StandInProducer, _checkpoint

NOW = 1_800_000_000_000  # the wall clock, in ms
LIMIT = 1000  # the commands topic's max.message.bytes
HEADERS: list[Header] = [("h", b"v")]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    opened = PartitionStore.open(tmp_path / "p0", bucket_ms=HOUR)
    yield opened
    opened.close()


async def test_a_key_staged_twice_leaves_only_its_last_entry_in_the_store(store: PartitionStore) -> None:
    """A stored key staged twice in one transaction, each time into another bucket: after the commit the store
    holds the last entry, and the copy from before the transaction is gone from its bucket."""
    before = Entry(first_seen=1, expires_at=5 * HOUR, partition=0, offset=1)
    store.write({b"k": Change.of(before)}, changelog_offset=None, stream_time=0)
    first = before._replace(expires_at=7 * HOUR, offset=2)
    last = before._replace(expires_at=3 * HOUR, offset=3)
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    ckpt.stage(b"k", first, before)
    ckpt.stage(b"k", last, first)
    ckpt.consumed(3)
    await ckpt.txn.commit()
    assert store.get_many([b"k"]) == {b"k": last}


async def test_a_changelog_record_is_stamped_with_the_time_it_is_written_and_no_original(
    store: PartitionStore,
) -> None:
    """A key claimed from a record three days old: its changelog record carries the wall-clock time (the
    changelog's retention runs from it) and no original-timestamp header (it never had another timestamp)."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store, wall=lambda: NOW / 1000)
    await ckpt.begin()
    ckpt.stage(b"k", Entry(first_seen=NOW - 72 * HOUR, expires_at=NOW, partition=0, offset=41), None)
    ckpt.consumed(41)
    await ckpt.txn.commit()
    assert producer.records["changelog"] == [(b"k", NOW, [])]


@pytest.mark.parametrize("key", [None, b"key"], ids=["no-key", "key"])
@pytest.mark.parametrize("headers", [None, HEADERS], ids=["no-headers", "headers"])
def test_a_record_fits_its_topic_up_to_the_last_byte(
    store: PartitionStore, key: bytes | None, headers: list[Header] | None
) -> None:
    """A record whose size on the wire (overhead, key, value, headers) is exactly its topic's limit fits; a byte
    more of value, or of key, does not."""
    ckpt = _checkpoint(StandInProducer(store), store, limits={"commands": LIMIT})
    value = b"x" * (LIMIT - record_size(key, b"", headers or []))
    assert ckpt.fits("commands", key, value, headers)
    assert not ckpt.fits("commands", key, value + b"x", headers)
    assert not ckpt.fits("commands", (key or b"") + b"k", value, headers)


@pytest.mark.parametrize(("key", "headers"), [(b"k", None), (None, HEADERS)], ids=["key", "headers"])
async def test_emit_counts_a_records_key_and_headers_against_its_topics_limit(
    store: PartitionStore, key: bytes | None, headers: list[Header] | None
) -> None:
    """A value that would just fit alone is refused with a key or with headers, in an error naming its size,
    the topic and the topic's limit; nothing is appended."""
    producer = StandInProducer(store)
    ckpt = _checkpoint(producer, store, limits={"commands": LIMIT})
    await ckpt.begin()
    value = b"x" * (LIMIT - RECORD_OVERHEAD)
    refused = rf"a record of {len(value)} bytes is larger than commands takes \({LIMIT} bytes\)"
    with pytest.raises(RecordTooLargeError, match=refused):
        ckpt.emit("commands", 0, key=key, value=value, timestamp=1, headers=headers)
    ckpt.consumed(1)
    await ckpt.txn.commit()
    assert producer.sent == []


async def test_a_part_that_handles_a_record_it_did_not_take_first_is_in_the_transaction_from_it(
    store: PartitionStore,
) -> None:
    """consumed() with no taken() before it: the part holds the transaction from that offset (where an abort
    rewinds it to), and the next record handled keeps it."""
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    ckpt.consumed(41)
    ckpt.consumed(42)
    assert (ckpt.in_transaction, ckpt.first_offset, ckpt.next_offset, ckpt.records) == (True, 41, 43, 2)


async def test_a_commit_reports_the_keys_expiry_dropped(store: PartitionStore) -> None:
    """Stream time moved two buckets past a stored key's expiry: the commit drops the key's bucket and its part
    says how many keys went."""
    old = Entry(first_seen=1, expires_at=HOUR // 2, partition=0, offset=1)
    store.write({b"old": Change.of(old)}, changelog_offset=None, stream_time=0)
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    ckpt.observe(3 * HOUR)
    ckpt.consumed(2)
    committed = await ckpt.txn.commit()
    assert committed.parts[ckpt.tp] == PartCommitted(records=1, expired=1)
    assert store.get_many([b"old"]) == {}


async def test_a_key_staged_in_the_open_transaction_is_found_there_until_it_ends(
    store: PartitionStore,
) -> None:
    """``staged`` gives the entry this transaction staged for a key (what a second copy in the same transaction is
    judged against, before the store has it), nothing for a key not staged, and nothing once the commit is done."""
    entry = Entry(first_seen=1, expires_at=5 * HOUR, partition=0, offset=7)
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    ckpt.stage(b"k", entry, None)
    ckpt.consumed(7)
    assert (ckpt.staged(b"k"), ckpt.staged(b"other")) == (entry, None)
    await ckpt.txn.commit()
    assert ckpt.staged(b"k") is None


async def test_the_next_transaction_counts_only_its_own_records(store: PartitionStore) -> None:
    """After a commit the part starts again from nothing: the next commit reports its one record, not three."""
    ckpt = _checkpoint(StandInProducer(store), store)
    await ckpt.begin()
    ckpt.consumed(1)
    ckpt.consumed(2)
    await ckpt.txn.commit()
    assert (ckpt.records, ckpt.in_transaction) == (0, False)
    await ckpt.begin()
    ckpt.consumed(3)
    committed = await ckpt.txn.commit()
    assert committed.parts[ckpt.tp] == PartCommitted(records=1, expired=0)
