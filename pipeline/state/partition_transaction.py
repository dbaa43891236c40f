"""One input partition's part of the worker's transaction: the only writer of its state.

A stage (:mod:`pipeline.worker.event_stage`, :mod:`pipeline.worker.effect_stage`) handles a
partition's records through its :class:`PartitionTransaction`:

1. each record is decided against the store *and* the part's own staged claims
   (:meth:`PartitionTransaction.lookup`, :meth:`PartitionTransaction.staged`);
2. :meth:`PartitionTransaction.stage` remembers a key's new state and appends its
   changelog record; commands, audit, DLQ records and reroutes are appended with
   :meth:`PartitionTransaction.emit`, each checked against its topic's size limit first;
3. the worker's :class:`~pipeline.state.transaction.Transaction` commits every part at
   once, then calls :meth:`PartitionTransaction.apply`: one RocksDB ``WriteBatch`` of the
   part's entries, changelog offset and stream time, then the expiry of whole buckets.

The store is never written before the Kafka commit: a claim that outlived an aborted
transaction would suppress the retried copy and lose its effect.
"""

from __future__ import annotations

from aiokafka import TopicPartition

from pipeline.errors import RecordTooLargeError, StoreError
from pipeline.kafka.record_size import RECORD_OVERHEAD, record_size
from pipeline.state.decision import Entry
from pipeline.state.store import Change, PartitionStore
from pipeline.state.transaction import Header, PartCommitted, Slot, Transaction


class PartitionTransaction:
    """What one partition stages in the worker's open transaction, and writes to its store after it."""

    def __init__(
        self, *, tp: TopicPartition, txn: Transaction, store: PartitionStore, changelog: TopicPartition
    ) -> None:
        self.tp = tp
        self.txn = txn
        self.store = store
        self.changelog = changelog
        self.changelog_slot: Slot = (changelog.topic, changelog.partition)
        self.restamp = False  # set while a record whose outputs the broker refused is redone: stamp them now
        self._staged: dict[bytes, Change] = {}
        self.first_offset: int | None = None  # the first input record taken into the open transaction
        self.next_offset: int | None = None  # the offset after the last one handled
        self.records = 0
        self.stream_time = store.stream_time

    @property
    def in_transaction(self) -> bool:
        """Whether this part holds records of the open transaction."""
        return self.first_offset is not None

    # -- reads -----------------------------------------------------------------
    def lookup(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """Current entries of ``keys``: staged in this transaction first, then the store (StoreError on a read failure)."""
        found = {key: self._staged[key].entry for key in keys if key in self._staged}
        missing = [key for key in keys if key not in found]
        if missing:
            found.update(self.store.get_many(missing))
        return found

    def staged(self, key: bytes) -> Entry | None:
        """The entry staged for ``key`` in this transaction, if any."""
        change = self._staged.get(key)
        return change.entry if change else None

    # -- writes ----------------------------------------------------------------
    async def begin(self) -> None:
        """Join the worker's transaction (opening it if none is open)."""
        await self.txn.join(self)

    def taken(self, offset: int) -> None:
        """Records from input ``offset`` on are being handled into the open transaction."""
        if self.first_offset is None:
            self.first_offset = offset

    def stage(self, key: bytes, entry: Entry, previous: Entry | None) -> None:
        """Remember ``key``'s new state and append its changelog record.

        The state reaches the store only after the commit; the changelog record (every change,
        so a restored store has the counts too) travels in the transaction itself. It is
        stamped with the time it is written, not the input's: the changelog's ``retention.ms``
        runs on the broker's clock from the record timestamp, and a worker working through a
        backlog days old would otherwise write claims the broker deletes while they are still
        live. Stream time travels in the entry itself (its ``last_seen``), which is what a
        replay reads (:mod:`pipeline.state.replay`).
        """
        earlier = self._staged.get(key)
        value = entry.encode()
        self._staged[key] = Change(entry, earlier.previous if earlier else previous, value)
        changelog = self.changelog
        written = int(self.txn.wall() * 1000)
        self.txn.emit(changelog.topic, changelog.partition, key=key, value=value, timestamp=written)

    def fits(self, topic: str, key: bytes | None, value: bytes, headers: list[Header] | None = None) -> bool:
        """Whether a record of this size is within ``topic``'s limit."""
        if headers:
            return self.txn.fits(topic, record_size(key, value, headers))
        return self.txn.fits(topic, RECORD_OVERHEAD + len(value) + (len(key) if key is not None else 0))

    def emit(
        self,
        topic: str,
        partition: int,
        *,
        key: bytes | None,
        value: bytes,
        timestamp: int,
        headers: list[Header] | None = None,
    ) -> None:
        """Append an output record to the open transaction.

        Raises :class:`RecordTooLargeError` when the record exceeds ``topic``'s limit:
        nothing is appended then, and the caller sends something smaller instead.
        """
        if not self.fits(topic, key, value, headers):
            raise RecordTooLargeError(
                f"a record of {len(value)} bytes is larger than {topic} takes ({self.txn.limits[topic]} bytes)"
            )
        self.txn.emit(
            topic, partition, key=key, value=value, timestamp=timestamp, headers=headers, restamp=self.restamp
        )

    async def drain(self) -> None:
        """Send the transaction's full batches now (they travel while the next records are handled)."""
        await self.txn.drain()

    def consumed(self, offset: int) -> None:
        """Mark input ``offset`` as handled in this transaction."""
        if self.first_offset is None:
            self.first_offset = offset
        self.next_offset = offset + 1
        self.records += 1

    def observe(self, timestamp: int) -> None:
        """Move stream time to ``timestamp`` (a valid record of this partition, its time already bounded)."""
        self.stream_time = max(self.stream_time, timestamp)

    # -- after the Kafka commit ----------------------------------------------------
    def apply(self, changelog_offset: int | None) -> PartCommitted:
        """Write the committed part to the store (one ``WriteBatch``), then expire whole buckets.

        A store failure is returned, not raised: Kafka holds the part, the store is behind it
        until a restore, and the other parts are written all the same.
        """
        records = self.records
        try:
            self.store.write(self._staged, changelog_offset=changelog_offset, stream_time=self.stream_time)
            expired = self.store.expire()
        except StoreError as exc:
            return PartCommitted(records, 0, exc)
        return PartCommitted(records, expired)

    def reset(self) -> None:
        """Forget what was staged (committed and written, or aborted)."""
        self._staged.clear()
        self.restamp = False
        self.first_offset = None
        self.next_offset = None
        self.records = 0
        self.stream_time = self.store.stream_time
