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
(``groups.py``), Kafka's error codes (``codes.py``); here, the broker that holds them, its
clock and retention, producers and the transaction coordinator, and the faults injected into
its answers.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from tests.simulation import blame
from tests.simulation.codes import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_NOT_AVAILABLE,
    CORRUPT_MESSAGE,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_PARTITIONS,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
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
    ABORT,
    COMMIT,
    ProducedBatch,
)

#: What a worker's own transactional id holds (eos-v2: one id a worker; pipeline.kafka.clients)
WORKER_ID = "-worker-"
# a corrupt refusal of a producer at most this often: the redo of the one before is taken
CORRUPT_APART_S = 5.0
# what a fault injected for every producer that is not transactional (a dlq replay's) waits for
PLAIN_PRODUCE = "plain-produce"

DEFAULT_TXN_TIMEOUT_S = 60.0
TXN_ABORT_SCAN_S = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms
RETENTION_CHECK_S = (
    5.0  # log.retention.check.interval.ms (Kafka's default is 5 minutes; scripts/test's broker 2 s)
)

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


class Broker:
    """The whole model; the wire layer (:mod:`tests.simulation.wire`) turns requests into calls of it."""

    def __init__(self, loop: SimLoop, rng: Random, trace: Callable[[str], None]) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.cluster_id = f"sim-{rng.getrandbits(48):012x}"
        self.topics: dict[str, Topic] = {}
        self.txns: dict[str, Txn] = {}
        self.coordinator = GroupCoordinator(self)
        self._pids = itertools.count(1000)
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
        error = self.coordinator.check_member(group_id, *member)
        if error:
            self.trace(
                f"broker: {txn_id}: offsets of group {group_id} for generation {member[0]} refused ({error})"
            )
            return error
        injected = self._injected("offsets", txn_id)
        if injected:
            return injected
        group = self.coordinator.group(group_id)
        group.pending_offsets.setdefault(pid, {}).update(offsets)
        return NONE

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
            group = self.coordinator.group(group_id)
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

    def group(self, group_id: str) -> Group:
        """The group of that id (an empty one if none had a member yet)."""
        return self.coordinator.group(group_id)
