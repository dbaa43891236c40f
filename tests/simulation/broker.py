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
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from tests.simulation import blame
from tests.simulation.loop import SimLoop
from tests.simulation.records import (
    ABORT,
    COMMIT,
    ProducedBatch,
    StoredBatch,
    at_offset,
    marker,
    stamped_on_append,
)
from tests.simulation.segments import Segments

#: What a worker's own transactional id holds (eos-v2: one id a worker; pipeline.kafka.clients)
WORKER_ID = "-worker-"
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
INVALID_TIMESTAMP = 32
OUT_OF_ORDER_SEQUENCE = 45
DUPLICATE_SEQUENCE = 46
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
UNSTABLE_OFFSET_COMMIT = 88
COORDINATOR_NOT_AVAILABLE = 15
INVALID_PARTITIONS = 37
GROUP_AUTHORIZATION_FAILED = 30
CORRUPT_MESSAGE = 2
# a corrupt refusal of a producer at most this often: the redo of the one before is taken
CORRUPT_APART_S = 5.0
# what a fault injected for every producer that is not transactional (a dlq replay's) waits for
PLAIN_PRODUCE = "plain-produce"

NO_LIMIT = 2**63 - 1
DEFAULT_TXN_TIMEOUT_S = 60.0
TXN_ABORT_SCAN_S = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms
RETENTION_CHECK_S = (
    5.0  # log.retention.check.interval.ms (Kafka's default is 5 minutes; scripts/test's broker 2 s)
)
LOG_APPEND_TIME = "LogAppendTime"


@dataclass
class TopicConfig:
    max_message_bytes: int = 1_048_588
    timestamp_after_max_ms: int = NO_LIMIT
    timestamp_before_max_ms: int = NO_LIMIT
    timestamp_type: str = "CreateTime"  # or LogAppendTime: the broker stamps what it appends
    cleanup_policy: str = "delete"
    retention_ms: int | None = None  # None: kept for ever (the model deletes only where a topic says)
    segment_bytes: int = 1 << 30

    def as_dict(self) -> dict[str, str]:
        return {
            "max.message.bytes": str(self.max_message_bytes),
            "message.timestamp.after.max.ms": str(self.timestamp_after_max_ms),
            "message.timestamp.before.max.ms": str(self.timestamp_before_max_ms),
            "message.timestamp.type": self.timestamp_type,
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(-1 if self.retention_ms is None else self.retention_ms),
            "segment.bytes": str(self.segment_bytes),
        }

    def checks_timestamps(self) -> bool:
        """Whether appends are checked against the timestamp bounds (not with LogAppendTime: the broker
        stamps them itself)."""
        return self.timestamp_type != LOG_APPEND_TIME

    def refuses_timestamp(self, timestamp: int, now_ms: int) -> bool:
        """Whether an append at ``now_ms`` refuses a record of ``timestamp`` (its bounds, KIP-937)."""
        if not self.checks_timestamps():
            return False
        return timestamp > now_ms + self.timestamp_after_max_ms or (
            self.timestamp_before_max_ms != NO_LIMIT and timestamp < now_ms - self.timestamp_before_max_ms
        )


@dataclass
class _ProducerEntry:
    epoch: int
    next_sequence: int = 0
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))  # seq, base, count


class PartitionLog:
    """One partition's log."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.batches: list[StoredBatch] = []
        self.end = 0  # the high watermark: the next offset
        self.log_start = 0
        self.open_txns: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[tuple[int, int, int]] = []  # producer id, first offset, marker offset
        self.producers: dict[int, _ProducerEntry] = {}
        self.changed = asyncio.Event()
        self.segments = Segments()
        self.deleted: list[tuple[int, bytes | None]] = []  # (offset, key) of records retention deleted

    def lso(self) -> int:
        return min(self.open_txns.values(), default=self.end)

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def append(self, produced: ProducedBatch, config: TopicConfig, now_ms: int) -> tuple[int, int]:
        """Append one produced batch; return (error code, base offset)."""
        if len(produced.raw) > config.max_message_bytes:
            return MESSAGE_TOO_LARGE, -1
        if any(config.refuses_timestamp(record.timestamp, now_ms) for record in produced.records):
            return INVALID_TIMESTAMP, -1
        pid = produced.producer_id
        if pid >= 0:
            entry = self.producers.get(pid)
            if entry is not None and produced.producer_epoch < entry.epoch:
                return INVALID_PRODUCER_EPOCH, -1
            if entry is None or produced.producer_epoch > entry.epoch:
                if produced.base_sequence != 0:
                    return OUT_OF_ORDER_SEQUENCE, -1
                entry = self.producers[pid] = _ProducerEntry(produced.producer_epoch)
            for seq, base, _count in entry.recent:
                if seq == produced.base_sequence:
                    return NONE, base  # a retry of a batch already written: acknowledged again
            if produced.base_sequence != entry.next_sequence:
                return OUT_OF_ORDER_SEQUENCE, -1
        base = self.end
        if not config.checks_timestamps():
            produced = stamped_on_append(produced, now_ms)
        stored = at_offset(produced, base, now_ms)
        self.batches.append(stored)
        self.segments.appended(base, len(stored.raw), stored.max_timestamp, config.segment_bytes)
        self.end = stored.last_offset + 1
        if pid >= 0:
            entry = self.producers[pid]
            entry.recent.append((produced.base_sequence, base, produced.count))
            entry.next_sequence = produced.base_sequence + produced.count
            if produced.transactional and pid not in self.open_txns:
                self.open_txns[pid] = base
        self._notify()
        return NONE, base

    def append_marker(self, pid: int, epoch: int, kind: int, now_ms: int) -> None:
        offset = self.end
        stored = marker(offset, pid, epoch, kind, now_ms)
        self.batches.append(stored)
        self.segments.appended(offset, len(stored.raw), now_ms, NO_LIMIT)  # a marker never rolls a segment
        self.end = offset + 1
        first = self.open_txns.pop(pid, None)
        if kind == ABORT and first is not None:
            self.aborted.append((pid, first, offset))
        entry = self.producers.get(pid)
        if entry is None or epoch > entry.epoch:
            self.producers[pid] = _ProducerEntry(epoch)
        self._notify()

    def read(self, offset: int, max_bytes: int, *, committed: bool) -> tuple[bytes, list[tuple[int, int]]]:
        """Raw batches from ``offset`` (whole batches, at least one), and the aborted transactions in range."""
        upper = self.lso() if committed else self.end
        chunks: list[bytes] = []
        size = 0
        last = offset - 1
        for batch in self._from(offset):
            if batch.base_offset >= upper:
                break
            if chunks and size + len(batch.raw) > max_bytes:
                break
            chunks.append(batch.raw)
            size += len(batch.raw)
            last = batch.last_offset
        aborted: list[tuple[int, int]] = []
        if committed and chunks:
            aborted = [(pid, first) for pid, first, end in self.aborted if end >= offset and first <= last]
        return b"".join(chunks), aborted

    def _from(self, offset: int) -> list[StoredBatch]:
        batches = self.batches
        lo, hi = 0, len(batches)
        while lo < hi:  # the first batch whose last offset is at or after ``offset``
            mid = (lo + hi) // 2
            if batches[mid].last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return batches[lo:]

    def retain(self, now_ms: int, retention_ms: int) -> int | None:
        """Delete the segments retention takes (:class:`~tests.simulation.segments.Segments`); the new log
        start offset, or None when nothing went."""
        start = self.segments.expire(now_ms, retention_ms, self.lso())
        if start is None:
            return None
        kept = self._from(start)
        for batch in self.batches[: len(self.batches) - len(kept)]:
            self.deleted.extend((record.offset, record.key) for record in batch.records)
        self.batches = list(kept)
        self.log_start = start
        self._notify()
        return start

    def caught_up(self, position: int) -> bool:
        """Whether a read_committed reader at ``position`` has nothing left to read: every batch from
        there up to the LSO is a marker or aborted (a consumer's committed offset stays before
        trailing markers, as Kafka's does)."""
        if position > self.lso():
            return False
        return all(r.offset < position for r in self.committed_records())

    def committed_records(self) -> list[Any]:
        """Every record a read_committed reader sees, in log order (for the oracle)."""
        aborted_ranges = {(pid, first): end for pid, first, end in self.aborted}
        aborted_open: dict[int, int] = {}
        upper = self.lso()
        out = []
        for batch in self.batches:
            if batch.base_offset >= upper:
                break
            if batch.control is not None:
                aborted_open.pop(batch.producer_id, None)
                continue
            pid = batch.producer_id
            if batch.transactional:
                if pid not in aborted_open and (pid, batch.base_offset) in aborted_ranges:
                    aborted_open[pid] = aborted_ranges[(pid, batch.base_offset)]
                if pid in aborted_open:
                    continue
            out.extend(batch.records)
        return out


class Topic:
    def __init__(self, name: str, partitions: int, config: TopicConfig) -> None:
        self.name = name
        self.id = uuid.uuid4()
        self.config = config
        self.reconfigured = False  # its limits changed while the workers ran (they learn limits at start)
        self.size_refusals = 0  # batches refused as larger than max.message.bytes
        self.partitions = [PartitionLog(name, p) for p in range(partitions)]


# -- transactions ------------------------------------------------------------------------


@dataclass
class Txn:
    txn_id: str
    pid: int
    epoch: int
    timeout_s: float
    state: str = "empty"  # empty, ongoing, prepare_commit, prepare_abort, complete_commit, complete_abort
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    started: float = 0.0


# -- the consumer group ------------------------------------------------------------------


@dataclass
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    protocol_type: str
    deadline: float = 0.0
    process: Any = None  # the simulated process behind it
    instance_id: str | None = None  # group.instance.id (static membership), from its JoinGroup
    join: asyncio.Future[Any] | None = None
    sync: asyncio.Future[Any] | None = None
    assignment: bytes = b""


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = "empty"  # empty, preparing, completing, stable
        self.generation = 0
        self.members: dict[str, Member] = {}
        self.pending_ids: set[str] = set()  # ids handed out with MEMBER_ID_REQUIRED
        self.leader: str | None = None
        self.protocol: str | None = None
        self.committed: dict[tuple[str, int], int] = {}
        self.pending_offsets: dict[int, dict[tuple[str, int], int]] = {}  # producer id -> offsets
        self.rebalance_deadline: float = 0.0
        self.stable_since: float = 0.0
        self.rebalance_timer: asyncio.TimerHandle | None = None


class Broker:
    """The whole model; the wire layer (:mod:`tests.simulation.wire`) turns requests into calls of it."""

    def __init__(self, loop: SimLoop, rng: Random, trace: Callable[[str], None]) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.cluster_id = f"sim-{rng.getrandbits(48):012x}"
        self.topics: dict[str, Topic] = {}
        self.txns: dict[str, Txn] = {}
        self.groups: dict[str, Group] = {}
        self._pids = itertools.count(1000)
        self._members = itertools.count(1)
        self.down = False
        self.outages = 0  # how many times it went down (a connection belongs to one of these lives)
        self.marker_delay = (0.0005, 0.02)
        # after the group's offsets, each partition's marker lands up to this much later, as on a cluster
        # where the transaction coordinator's WriteTxnMarkers reach the partitions' leaders one by one
        self.marker_spread = (0.0, 0.05)
        self._scan: asyncio.TimerHandle | None = None
        self.injected: list[tuple[str, str, str]] = []  # (fault, detail, transactional id): answered once
        self.storm_until = 0.0  # until then every AddPartitionsToTxn kills its producer's sender
        self.owner_violations: list[str] = []
        self.fenced_processes: set[tuple[Any, str]] = set()  # (process, txn id) told it is fenced
        self.refused: list[blame.Refusal] = []  # records of the batches refused for their size or timestamp
        # transactional id -> when a produce of it was last refused as corrupt
        self.corrupted_at: dict[str, float] = {}
        self.lose_reply = False  # the reply being written is lost with its connection (faults.LOST_COMMIT)

    def inject(self, fault: str, detail: str, txn_id: str) -> None:
        """The next matching request of ``txn_id`` gets an error (see ``_injected``)."""
        self.injected.append((fault, detail, txn_id))

    def _take(self, detail: str, txn_id: str) -> str | None:
        """The fault injected for ``txn_id``'s next ``detail``, taken (each is answered once), or None."""
        for i, (fault, wanted, target) in enumerate(self.injected):
            if wanted == detail and target == txn_id:
                del self.injected[i]
                return fault
        return None

    def _injected(self, detail: str, txn_id: str) -> int:
        """The error injected for ``txn_id``'s next ``detail`` (NONE: none)."""
        fault = self._take(detail, txn_id)
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
        self._scan = self.later(TXN_ABORT_SCAN_S, self._abort_timed_out)
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
                error = self._check_txn_partition(
                    produced.producer_id, produced.producer_epoch, topic, partition
                )
                if error:
                    return error, -1
                error = self._corrupt(produced.producer_id)
                if error:
                    self.trace(f"broker: produce {topic}-{partition} refused as corrupt (injected)")
                    return error, -1
            elif self.injected and self._take(PLAIN_PRODUCE, "") is not None:
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
        txn = next((t for t in self.txns.values() if t.pid == pid), None)
        if txn is None:
            return NONE
        error = self._injected("produce", txn.txn_id)
        if not error:
            return NONE
        if self.now() - self.corrupted_at.get(txn.txn_id, -CORRUPT_APART_S) < CORRUPT_APART_S:
            self.trace(f"broker: {txn.txn_id}: corrupt fault dropped (one hit it lately)")
            return NONE  # two flipped bits in a row on one producer: not this model's network
        self.corrupted_at[txn.txn_id] = self.now()
        return error

    def _check_txn_partition(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        """KIP-890's check: a transactional batch belongs to its producer's open transaction."""
        txn = next((t for t in self.txns.values() if t.pid == pid), None)
        if txn is None:
            return INVALID_PRODUCER_ID_MAPPING
        if epoch < txn.epoch:
            return INVALID_PRODUCER_EPOCH
        if txn.state != "ongoing" or (topic, partition) not in txn.partitions:
            return INVALID_TXN_STATE
        return NONE

    # -- transactions ------------------------------------------------------------------
    def init_producer_id(
        self, txn_id: str | None, timeout_ms: int, process: Any = None
    ) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        if txn_id is None:
            return NONE, next(self._pids), 0
        self._check_owner(txn_id, process)
        txn = self.txns.get(txn_id)
        if txn is None:
            txn = self.txns[txn_id] = Txn(txn_id, next(self._pids), -1, timeout_ms / 1000)
        txn.timeout_s = timeout_ms / 1000
        if txn.state in ("prepare_commit", "prepare_abort"):
            return CONCURRENT_TRANSACTIONS, -1, -1
        if txn.state == "ongoing":
            txn.epoch += 1  # fences the old producer at once; its transaction is aborted
            self.trace(f"broker: {txn_id} re-initialised: aborting its open transaction (epoch {txn.epoch})")
            self._end(txn, commit=False)
            return CONCURRENT_TRANSACTIONS, -1, -1
        txn.epoch += 1
        txn.state = "empty"
        txn.partitions = set()
        txn.groups = set()
        return NONE, txn.pid, txn.epoch

    def _check_owner(self, txn_id: str, process: Any) -> None:
        """Note a producer started by a process that was told it is fenced on this transactional id and has
        not been given an assignment since: it reopens a partition the group moved, fencing its rightful owner
        (``owner_violations``). A start that was under way when the process learned of a fence is not one."""
        if (
            WORKER_ID in txn_id
        ):  # a worker's own id (eos-v2): it restarts its producer after a fence by design
            return
        if process is not None and (process, txn_id) in self.fenced_processes:
            self.owner_violations.append(
                f"{getattr(process, 'name', process)} started a producer for {txn_id} after it was fenced on it, "
                "without a new assignment: it fences the partition's owner"
            )

    def told_fenced(self, process: Any, txn_id: str | None) -> None:
        """``process`` got INVALID_PRODUCER_EPOCH for ``txn_id``: it must not start it again unassigned."""
        if process is not None and txn_id:
            self.fenced_processes.add((process, txn_id))

    def assigned(self, process: Any) -> None:
        """``process`` got an assignment: the group decided anew; what it was fenced on may be its again."""
        self.fenced_processes = {(p, t) for p, t in self.fenced_processes if p is not process}

    def _txn_for(self, txn_id: str, pid: int, epoch: int) -> tuple[int, Txn | None]:
        txn = self.txns.get(txn_id)
        if txn is None or txn.pid != pid:
            return INVALID_PRODUCER_ID_MAPPING, None
        if epoch < txn.epoch:
            return INVALID_PRODUCER_EPOCH, None
        if txn.state in ("prepare_commit", "prepare_abort"):
            return CONCURRENT_TRANSACTIONS, None
        return NONE, txn

    def _open(self, txn: Txn) -> None:
        if txn.state != "ongoing":
            txn.state = "ongoing"
            txn.started = self.now()
            txn.partitions = set()
            txn.groups = set()

    def add_partitions(
        self, txn_id: str, pid: int, epoch: int, tps: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        error, txn = self._txn_for(txn_id, pid, epoch)
        if txn is None:
            return dict.fromkeys(tps, error)
        injected = self._injected("add-partitions", txn_id)
        if not injected and self.now() < self.storm_until:
            injected = INVALID_TXN_STATE  # a storm: every transaction's producer dies for a while
        if injected:
            return dict.fromkeys(tps, injected)
        self._open(txn)
        result: dict[tuple[str, int], int] = {}
        for tp in tps:
            if self.log(*tp) is None:
                result[tp] = UNKNOWN_TOPIC_OR_PARTITION
            else:
                txn.partitions.add(tp)
                result[tp] = NONE
        return result

    def add_offsets(self, txn_id: str, pid: int, epoch: int, group: str) -> int:
        error, txn = self._txn_for(txn_id, pid, epoch)
        if txn is None:
            return error
        self._open(txn)
        txn.groups.add(group)
        return NONE

    def txn_offset_commit(
        self,
        txn_id: str,
        group_id: str,
        pid: int,
        epoch: int,
        offsets: dict[tuple[str, int], int],
        member: tuple[int, str, str | None] = (-1, "", None),
    ) -> int:
        """A transaction's offsets, pending until its markers; ``member`` is the (generation, member id, group
        instance id) v3 carries (v0 carries none: the defaults)."""
        error, txn = self._txn_for(txn_id, pid, epoch)
        if txn is None:
            return error
        if txn.state != "ongoing" or group_id not in txn.groups:
            return INVALID_TXN_STATE
        error = self._check_member(group_id, *member)
        if error:
            self.trace(
                f"broker: {txn_id}: offsets of group {group_id} for generation {member[0]} refused ({error})"
            )
            return error
        injected = self._injected("offsets", txn_id)
        if injected:
            return injected
        group = self.group(group_id)
        group.pending_offsets.setdefault(pid, {}).update(offsets)
        return NONE

    def _check_member(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """The group coordinator's check of a transaction's offsets (Kafka 4, a classic group): a request that
        names no member (v0, or v3 from a client outside the group) is taken; one that does is taken only
        from a member of the current generation, so a zombie's transaction cannot commit offsets."""
        group = self.groups.get(group_id)
        if group is None:
            return ILLEGAL_GENERATION if generation >= 0 else NONE
        if generation < 0 and not group.members:
            return NONE
        if generation < 0 and not member_id and instance_id is None:
            return NONE  # transactional offsets need no member: an old producer's v0
        if instance_id is not None:
            static = next((m for m in group.members.values() if m.instance_id == instance_id), None)
            if static is None:
                return UNKNOWN_MEMBER_ID
            if static.member_id != member_id:
                return FENCED_INSTANCE_ID
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        return ILLEGAL_GENERATION if generation != group.generation else NONE

    def end_txn(self, txn_id: str, pid: int, epoch: int, commit: bool) -> int:
        txn = self.txns.get(txn_id)
        if txn is None or txn.pid != pid:
            return INVALID_PRODUCER_ID_MAPPING
        if epoch < txn.epoch:
            return INVALID_PRODUCER_EPOCH
        wanted = "commit" if commit else "abort"
        if txn.state == f"complete_{wanted}":
            return NONE  # a retry of what is done
        if txn.state == f"prepare_{wanted}":
            return CONCURRENT_TRANSACTIONS
        if txn.state != "ongoing":
            return INVALID_TXN_STATE
        if commit:
            injected = self._injected("end-txn", txn_id) or self._injected("end-txn-retry", txn_id)
            if injected:
                return injected
            if self._take("end-txn-lost", txn_id) is not None:
                self.trace(f"broker: {txn_id}: commit completed, its reply lost; the id is fenced (injected)")
                self._end(txn, commit=True)
                self.lose_reply = True
                self._fence_when_ended(txn_id)
                return NONE
        self._end(txn, commit=commit)
        return NONE

    def _fence_when_ended(self, txn_id: str) -> None:
        """Another producer initialises ``txn_id`` as soon as its transaction has ended: its epoch moves on."""
        txn = self.txns[txn_id]
        error, _, _ = self.init_producer_id(txn_id, int(txn.timeout_s * 1000))
        if error == CONCURRENT_TRANSACTIONS:
            self.later(0.005, self._fence_when_ended, txn_id)

    def _end(self, txn: Txn, *, commit: bool) -> None:
        """PrepareCommit/PrepareAbort now; the markers (and the offsets) a moment later."""
        txn.state = "prepare_commit" if commit else "prepare_abort"
        delay = self.rng.uniform(*self.marker_delay)
        self.later(delay, self._complete, txn, commit, txn.epoch)

    def _complete(self, txn: Txn, commit: bool, epoch: int) -> None:
        """The group's offsets first (the group coordinator's marker), then each partition's marker, one by
        one: a reader of the offsets may find the data partitions' transaction still open for a moment."""
        if self.down:  # markers are written once the broker is back
            self.later(0.5, self._complete, txn, commit, epoch)
            return
        for group_id in sorted(txn.groups):
            group = self.group(group_id)
            offsets = group.pending_offsets.pop(txn.pid, {})
            if commit:
                group.committed.update(offsets)
        txn.groups = set()
        pending = sorted(txn.partitions)
        txn.partitions = set()
        if not pending:
            txn.state = "complete_commit" if commit else "complete_abort"
            return
        left = [len(pending)]
        for topic, partition in pending:
            self.later(
                self.rng.uniform(*self.marker_spread),
                self._mark,
                txn,
                commit,
                epoch,
                (topic, partition),
                left,
            )

    def _mark(self, txn: Txn, commit: bool, epoch: int, where: tuple[str, int], left: list[int]) -> None:
        """One partition's marker; the transaction is complete once the last has landed."""
        if self.down:
            self.later(0.5, self._mark, txn, commit, epoch, where, left)
            return
        log = self.log(*where)
        if log is not None:
            log.append_marker(txn.pid, epoch, COMMIT if commit else ABORT, self.now_ms())
        left[0] -= 1
        if left[0] == 0:
            txn.state = "complete_commit" if commit else "complete_abort"

    def _abort_timed_out(self) -> None:
        self._scan = self.later(TXN_ABORT_SCAN_S, self._abort_timed_out)
        if self.down:
            return
        now = self.now()
        for txn in self.txns.values():
            if txn.state == "ongoing" and now - txn.started > txn.timeout_s:
                txn.epoch += 1
                self.trace(
                    f"broker: {txn.txn_id} open {now - txn.started:.1f}s: timed out, aborted, epoch {txn.epoch}"
                )
                self._end(txn, commit=False)

    # -- groups ------------------------------------------------------------------------
    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return group

    def describe_group(self, group_id: str) -> tuple[str, str, str, list[Member]]:
        """``group_id``'s state as Kafka names it, protocol type, protocol and members (DescribeGroups)."""
        group = self.groups.get(group_id)
        if group is None:
            return "Dead", "", "", []
        state = {
            "empty": "Empty",
            "preparing": "PreparingRebalance",
            "completing": "CompletingRebalance",
            "stable": "Stable",
        }[group.state]
        members = list(group.members.values())
        protocol_type = members[0].protocol_type if members else "consumer"
        return state, protocol_type, group.protocol or "", members

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        process: Any,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> dict[str, Any]:
        group = self.group(group_id)
        if instance_id is not None:
            if member_id and self._fenced_static(group, member_id, instance_id):
                return {"error": FENCED_INSTANCE_ID, "member_id": member_id}
            if not member_id:  # KIP-345: a static member is given its id at once, no MEMBER_ID_REQUIRED
                member_id = f"{instance_id}-{next(self._members)}"
                group.pending_ids.add(member_id)
                self._replace_static(group, instance_id, member_id)
        if not member_id:
            member_id = f"{client_id}-{next(self._members)}"
            group.pending_ids.add(member_id)
            return {"error": MEMBER_ID_REQUIRED, "member_id": member_id}
        member = group.members.get(member_id)
        if member is None:
            if member_id not in group.pending_ids:
                return {"error": UNKNOWN_MEMBER_ID, "member_id": member_id}
            group.pending_ids.discard(member_id)
            member = group.members[member_id] = Member(
                member_id,
                client_id,
                session_timeout_ms / 1000,
                rebalance_timeout_ms / 1000,
                protocols,
                protocol_type,
            )
            self.trace(f"broker: group {group_id}: {member_id} joins")
        member.protocols = protocols
        member.process = process
        member.instance_id = instance_id
        member.deadline = self.now() + member.session_timeout_s
        self._expire_later(group, member)
        if member.join is not None and not member.join.done():
            member.join.set_result({"error": UNKNOWN_MEMBER_ID, "member_id": member_id})
        member.join = self.loop.create_future()
        if group.state != "preparing":
            self._prepare(group, f"{member_id} joined")
        self._maybe_complete_join(group)
        return await member.join  # type: ignore[no-any-return]

    @staticmethod
    def _static(group: Group, instance_id: str) -> Member | None:
        return next((m for m in group.members.values() if m.instance_id == instance_id), None)

    def _fenced_static(self, group: Group, member_id: str, instance_id: str | None) -> bool:
        """KIP-345: a request naming ``instance_id`` from another member id than the one the group now knows
        it by (a newer member joined under it) is answered FENCED_INSTANCE_ID."""
        if instance_id is None:
            return False
        static = self._static(group, instance_id)
        return static is not None and static.member_id != member_id

    def _replace_static(self, group: Group, instance_id: str, member_id: str) -> None:
        """A static member joins under ``instance_id`` with no member id: the member the group knew by it is
        replaced (its pending JoinGroup or SyncGroup answered FENCED_INSTANCE_ID); the group rebalances (the
        coordinator may skip that when stable and the protocols are unchanged: the model always does it)."""
        old = self._static(group, instance_id)
        if old is None:
            return
        del group.members[old.member_id]
        for waiting in (old.join, old.sync):
            if waiting is not None and not waiting.done():
                waiting.set_result({"error": FENCED_INSTANCE_ID, "member_id": old.member_id})
        if group.leader == old.member_id:
            group.leader = None
        self.trace(
            f"broker: group {group.group_id}: {member_id} replaces {old.member_id} (instance {instance_id})"
        )

    def _prepare(self, group: Group, why: str) -> None:
        group.state = "preparing"
        self.trace(f"broker: group {group.group_id}: rebalance ({why})")
        for member in group.members.values():
            if member.sync is not None and not member.sync.done():
                member.sync.set_result({"error": REBALANCE_IN_PROGRESS})
        timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        group.rebalance_timer = self.later(timeout, self._rebalance_timed_out, group, group.generation)

    def _rebalance_timed_out(self, group: Group, generation: int) -> None:
        if group.state != "preparing" or group.generation != generation:
            return
        for member_id, member in list(group.members.items()):
            if member.join is None or member.join.done():
                self.trace(f"broker: group {group.group_id}: {member_id} did not rejoin in time; removed")
                del group.members[member_id]
        self._maybe_complete_join(group, force=True)

    def _maybe_complete_join(self, group: Group, *, force: bool = False) -> None:
        if group.state != "preparing":
            return
        waiting = [m for m in group.members.values() if m.join is not None and not m.join.done()]
        if not force and len(waiting) < len(group.members):
            return
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None
        group.generation += 1
        if not group.members:
            group.state = "empty"
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol = group.members[group.leader].protocols[0][0]
        group.state = "completing"
        self.trace(
            f"broker: group {group.group_id}: generation {group.generation}, members {sorted(group.members)}"
        )
        members = [(m.member_id, dict(m.protocols).get(group.protocol, b"")) for m in group.members.values()]
        for member in group.members.values():
            member.deadline = self.now() + member.session_timeout_s
            self._expire_later(group, member)
            if member.join is not None and not member.join.done():
                member.join.set_result(
                    {
                        "error": NONE,
                        "generation": group.generation,
                        "protocol": group.protocol,
                        "leader": group.leader,
                        "member_id": member.member_id,
                        "members": members if member.member_id == group.leader else [],
                    }
                )

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: list[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> dict[str, Any]:
        group = self.group(group_id)
        if self._fenced_static(group, member_id, instance_id):
            return {"error": FENCED_INSTANCE_ID}
        member = group.members.get(member_id)
        if member is None:
            return {"error": UNKNOWN_MEMBER_ID}
        if generation != group.generation:
            return {"error": ILLEGAL_GENERATION}
        if group.state == "preparing":
            return {"error": REBALANCE_IN_PROGRESS}
        member.deadline = self.now() + member.session_timeout_s
        if group.state == "stable":
            return {"error": NONE, "assignment": member.assignment}
        if member_id == group.leader:
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = "stable"
            group.stable_since = self.now()
            self.trace(f"broker: group {group.group_id}: generation {group.generation} stable")
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result({"error": NONE, "assignment": m.assignment})
            return {"error": NONE, "assignment": member.assignment}
        if member.sync is not None and not member.sync.done():
            member.sync.set_result({"error": REBALANCE_IN_PROGRESS})
        member.sync = self.loop.create_future()
        return await member.sync  # type: ignore[no-any-return]

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> int:
        group = self.group(group_id)
        if self._fenced_static(group, member_id, instance_id):
            return FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        member.deadline = self.now() + member.session_timeout_s
        self._expire_later(group, member)
        if group.state == "preparing":
            return REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return ILLEGAL_GENERATION
        return NONE

    def leave(self, group_id: str, member_id: str) -> int:
        group = self.group(group_id)
        if group.members.pop(member_id, None) is None:
            return UNKNOWN_MEMBER_ID
        self.trace(f"broker: group {group_id}: {member_id} leaves")
        self._after_removal(group, f"{member_id} left")
        return NONE

    def _expire_later(self, group: Group, member: Member) -> None:
        self.later(member.session_timeout_s + 0.001, self._expire, group, member)

    def _expire(self, group: Group, member: Member) -> None:
        if group.members.get(member.member_id) is not member or self.now() < member.deadline:
            return
        if self.down:
            return
        if group.state == "preparing" and member.join is not None and not member.join.done():
            return  # waiting in JoinGroup: kept until the rebalance ends
        del group.members[member.member_id]
        self.trace(f"broker: group {group.group_id}: {member.member_id} session expired")
        self._after_removal(group, f"{member.member_id} expired")

    def _after_removal(self, group: Group, why: str) -> None:
        if group.state == "preparing":
            self._maybe_complete_join(group)
        elif group.members:
            self._prepare(group, why)
        else:
            group.state = "empty"
            group.generation += 1

    def restarted(self) -> None:
        """Back after an outage: sessions count from now (Kafka reloads the group with fresh deadlines)."""
        for group in self.groups.values():
            for member in group.members.values():
                member.deadline = self.now() + member.session_timeout_s
                self._expire_later(group, member)
            if group.state == "preparing":
                if group.rebalance_timer is not None:
                    group.rebalance_timer.cancel()
                timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
                group.rebalance_timer = self.later(
                    timeout, self._rebalance_timed_out, group, group.generation
                )
            for member in group.members.values():  # requests held in JoinGroup and SyncGroup were lost
                member.join = None
                member.sync = None

    def offset_fetch(
        self, group_id: str, tps: list[tuple[str, int]], *, require_stable: bool = False
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Each partition's (committed offset or -1, error). With ``require_stable`` (OffsetFetch v7+), a
        partition a pending transaction holds offsets of (its TxnOffsetCommit taken, its markers not yet
        written) is UNSTABLE_OFFSET_COMMIT, so a new owner waits for that transaction instead of starting
        from the offset before it."""
        group = self.group(group_id)
        held = (
            {tp for offsets in group.pending_offsets.values() for tp in offsets} if require_stable else set()
        )
        return {
            tp: (-1, UNSTABLE_OFFSET_COMMIT) if tp in held else (group.committed.get(tp, -1), NONE)
            for tp in tps
        }
