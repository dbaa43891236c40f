"""An in-memory model of one Kafka broker: logs, transactions and a consumer group.

What it models, as Kafka does it for the clients and request versions aiokafka uses:

- per-partition logs of record batches with offsets, the last stable offset (LSO: the
  first offset of the oldest open transaction), transaction markers as control
  batches and the index of aborted transactions that read_committed fetches get;
- idempotent producers: producer ids, epochs and sequence numbers (a retried batch
  is acknowledged once, not written twice); a batch of an older epoch is refused;
- the transaction coordinator: InitProducerId fences the previous epoch and aborts
  its open transaction, partitions and offsets added to a transaction, EndTxn with
  markers written a moment later, and transactions open longer than their timeout
  aborted with the epoch bumped (their producer is fenced);
- the group coordinator: the classic eager protocol with generations, JoinGroup
  held until every member rejoined (or the rebalance timeout), SyncGroup held until
  the leader's assignment, heartbeats, session expiry, and committed offsets,
  written only when the transaction that carried them commits; a transaction's
  offsets that carry a member (TxnOffsetCommit v3, KIP-447) are refused unless
  that member is in the current generation, and an OffsetFetch ``require_stable``
  answers a partition whose offsets a transaction holds UNSTABLE_OFFSET_COMMIT;
- per-topic ``max.message.bytes`` and the timestamp bounds
  (``message.timestamp.after.max.ms``, ``message.timestamp.before.max.ms``);
  ``message.timestamp.type=LogAppendTime`` (the broker stamps each batch it appends);
- segments and retention by time on the broker's clock (:mod:`tests.simulation.segments`);
- more partitions for a topic (CreatePartitions) and a group's description (DescribeGroups);
- outages: while down, the broker answers nothing; what was in flight is lost.

Everything that takes time (a marker, a session expiring) is a timer of the world
on the simulation's loop; nothing here belongs to a process.

Its parts: the logs and topic configurations (``logs.py``), the group coordinator
(``groups.py``), the transaction coordinator (``txns.py``), Kafka's error codes (``codes.py``);
here, the broker that holds them, its clock and retention, the produce path, and the faults
injected into its answers.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from random import Random
from typing import Any

from tests.simulation import blame
from tests.simulation.codes import (
    COORDINATOR_NOT_AVAILABLE,
    CORRUPT_MESSAGE,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_PARTITIONS,
    INVALID_TIMESTAMP,
    INVALID_TXN_STATE,
    MESSAGE_TOO_LARGE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tests.simulation.groups import Group, GroupCoordinator
from tests.simulation.logs import PartitionLog, Topic, TopicConfig
from tests.simulation.loop import SimLoop
from tests.simulation.records import (
    ProducedBatch,
)
from tests.simulation.txns import TransactionCoordinator

# a corrupt refusal of a producer at most this often: the redo of the one before is taken
CORRUPT_APART_S = 5.0
# what a fault injected for every producer that is not transactional (a dlq replay's) waits for
PLAIN_PRODUCE = "plain-produce"

DEFAULT_TXN_TIMEOUT_S = 60.0
RETENTION_CHECK_S = (
    5.0  # log.retention.check.interval.ms (Kafka's default is 5 minutes; scripts/test's broker 2 s)
)


class Broker:
    """The whole model; the wire layer (:mod:`tests.simulation.wire`) turns requests into calls of it."""

    def __init__(self, loop: SimLoop, rng: Random, trace: Callable[[str], None]) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.cluster_id = f"sim-{rng.getrandbits(48):012x}"
        self.topics: dict[str, Topic] = {}
        self.coordinator = GroupCoordinator(self)
        self.transactions = TransactionCoordinator(self)
        self.down = False
        self.outages = 0  # how many times it went down (a connection belongs to one of these lives)
        self.injected: list[tuple[str, str, str]] = []  # (fault, detail, transactional id): answered once
        self.storm_until = 0.0  # until then every AddPartitionsToTxn kills its producer's sender
        self.refused: list[blame.Refusal] = []  # records of the batches refused for their size or timestamp
        # transactional id -> when a produce of it was last refused as corrupt
        self.corrupted_at: dict[str, float] = {}
        self.lose_reply = False  # the reply being written is lost with its connection (faults.LOST_COMMIT)

    def inject(self, fault: str, detail: str, txn_id: str) -> None:
        """The next matching request of ``txn_id`` gets an error (see :meth:`injected_error`)."""
        self.injected.append((fault, detail, txn_id))

    def take_injected(self, detail: str, txn_id: str) -> str | None:
        """The fault injected for ``txn_id``'s next ``detail``, taken (each is answered once), or None."""
        for i, (fault, wanted, target) in enumerate(self.injected):
            if wanted == detail and target == txn_id:
                del self.injected[i]
                return fault
        return None

    def injected_error(self, detail: str, txn_id: str) -> int:
        """The error injected for ``txn_id``'s next ``detail`` (NONE: none)."""
        fault = self.take_injected(detail, txn_id)
        if fault is None:
            return NONE
        code = {
            ("producer-fatal", "add-partitions"): INVALID_TXN_STATE,
            ("producer-fatal", "end-txn"): INVALID_TXN_STATE,
            ("commit-refused", "offsets"): GROUP_AUTHORIZATION_FAILED,
            ("commit-refused", "end-txn-retry"): COORDINATOR_NOT_AVAILABLE,
            ("corrupt", "produce"): CORRUPT_MESSAGE,
        }[(fault, detail)]
        self.trace(f"broker: {txn_id}: {detail} answered with error {code} (injected)")
        return code

    # -- time --------------------------------------------------------------------------
    def now(self) -> float:
        return float(self.loop.time())

    def now_ms(self) -> int:
        return int(self.loop.wall() * 1000)

    def later(self, delay: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """A timer of the world (no process owns it)."""
        import contextvars  # noqa: PLC0415

        return self.loop.call_later(delay, callback, *args, context=contextvars.Context())

    def start(self) -> None:
        self.transactions.start()
        self.later(RETENTION_CHECK_S, self._retain)

    def _retain(self) -> None:
        """The log manager's retention check: segments older than their topic's ``retention.ms``."""
        self.later(RETENTION_CHECK_S, self._retain)
        if self.down:
            return
        now = self.now_ms()
        for topic in self.topics.values():
            retention = topic.config.retention_ms
            if retention is None or "delete" not in topic.config.cleanup_policy:
                continue
            for log in topic.partitions:
                start = log.retain(now, retention)
                if start is not None:
                    self.trace(f"broker: retention deleted {topic.name}-{log.partition} below offset {start}")

    # -- topics ------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, config: TopicConfig) -> Topic:
        topic = self.topics[name] = Topic(name, partitions, config)
        return topic

    def delete_topic(self, name: str) -> None:
        self.topics.pop(name, None)

    def create_partitions(self, name: str, count: int) -> int:
        """Raise ``name`` to ``count`` partitions (CreatePartitions); an error code."""
        topic = self.topics.get(name)
        if topic is None:
            return UNKNOWN_TOPIC_OR_PARTITION
        if count <= len(topic.partitions):
            return INVALID_PARTITIONS
        topic.partitions.extend(PartitionLog(name, p) for p in range(len(topic.partitions), count))
        self.trace(f"broker: {name} now has {count} partitions")
        return NONE

    def log(self, topic: str, partition: int) -> PartitionLog | None:
        found = self.topics.get(topic)
        if found is None or not 0 <= partition < len(found.partitions):
            return None
        return found.partitions[partition]

    # -- producing ---------------------------------------------------------------------
    def produce(self, topic: str, partition: int, batches: list[ProducedBatch]) -> tuple[int, int]:
        log = self.log(topic, partition)
        if log is None:
            return UNKNOWN_TOPIC_OR_PARTITION, -1
        config = self.topics[topic].config
        first_base = -1
        for produced in batches:
            if produced.transactional:
                error = self.transactions.check_partition(
                    produced.producer_id, produced.producer_epoch, topic, partition
                )
                if error:
                    return error, -1
                error = self._corrupt(produced.producer_id)
                if error:
                    self.trace(f"broker: produce {topic}-{partition} refused as corrupt (injected)")
                    return error, -1
            elif self.injected and self.take_injected(PLAIN_PRODUCE, "") is not None:
                self.trace(
                    f"broker: produce {topic}-{partition} (not transactional) refused as corrupt (injected)"
                )
                return CORRUPT_MESSAGE, -1
            now_ms = self.now_ms()
            error, base = log.append(produced, config, now_ms)
            if error == MESSAGE_TOO_LARGE:
                self.topics[topic].size_refusals += 1
            if error in (MESSAGE_TOO_LARGE, INVALID_TIMESTAMP):
                kind = blame.SIZE if error == MESSAGE_TOO_LARGE else blame.TIMESTAMP
                self.refused.extend(
                    blame.refused(
                        topic,
                        produced,
                        kind,
                        limit=config.max_message_bytes,
                        outside=functools.partial(config.refuses_timestamp, now_ms=now_ms),
                    )
                )
            if error:
                if error not in (MESSAGE_TOO_LARGE, INVALID_TIMESTAMP):
                    self.trace(f"broker: produce {topic}-{partition} refused (error {error})")
                return error, -1
            if first_base < 0:
                first_base = base
        return NONE, first_base

    def _corrupt(self, pid: int) -> int:
        """CORRUPT_MESSAGE when a corrupt fault waits for ``pid``'s transactional id (and none hit it lately)."""
        if not self.injected:  # every transactional produce asks: nothing to look up, most of the time
            return NONE
        txn = self.transactions.of_producer(pid)
        if txn is None:
            return NONE
        error = self.injected_error("produce", txn.txn_id)
        if not error:
            return NONE
        if self.now() - self.corrupted_at.get(txn.txn_id, -CORRUPT_APART_S) < CORRUPT_APART_S:
            self.trace(f"broker: {txn.txn_id}: corrupt fault dropped (one hit it lately)")
            return NONE  # two flipped bits in a row on one producer: not this model's network
        self.corrupted_at[txn.txn_id] = self.now()
        return error

    def group(self, group_id: str) -> Group:
        """The group of that id (an empty one if none had a member yet)."""
        return self.coordinator.group(group_id)
