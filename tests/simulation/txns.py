"""The broker model's transaction coordinator: producer ids and epochs, transactions and their markers.

InitProducerId fences the previous epoch and aborts its open transaction; partitions and a group's
offsets join a transaction (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, checked against
the group's generation by the group coordinator, ``groups.py``); EndTxn writes the group's offsets
first, then each partition's marker a moment later, one by one; a transaction open longer than its
timeout is aborted with its epoch bumped (its producer fenced). It also notes a process that starts
a producer it was told is fenced, without a new assignment (``owner_violations``).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.simulation.codes import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TXN_STATE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tests.simulation.records import ABORT, COMMIT

if TYPE_CHECKING:
    from tests.simulation.broker import Broker

#: What a worker's own transactional id holds (eos-v2: one id a worker; pipeline.kafka.clients)
WORKER_ID = "-worker-"
TXN_ABORT_SCAN_S = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms


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


class TransactionCoordinator:
    """The transactions of the broker model, by transactional id (see the module)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.txns: dict[str, Txn] = {}
        self._pids = itertools.count(1000)
        self.marker_delay = (0.0005, 0.02)
        # after the group's offsets, each partition's marker lands up to this much later, as on a cluster
        # where the transaction coordinator's WriteTxnMarkers reach the partitions' leaders one by one
        self.marker_spread = (0.0, 0.05)
        self._scan: asyncio.TimerHandle | None = None
        self.owner_violations: list[str] = []
        self.fenced_processes: set[tuple[Any, str]] = set()  # (process, txn id) told it is fenced
        self.process_of: dict[int, Any] = {}  # an idempotent producer's id -> the process that asked for it

    def start(self) -> None:
        """The scan for transactions open past their timeout, every TXN_ABORT_SCAN_S."""
        self._scan = self.broker.later(TXN_ABORT_SCAN_S, self._abort_timed_out)

    def of_producer(self, pid: int) -> Txn | None:
        """The transaction of producer id ``pid``, if any."""
        return next((t for t in self.txns.values() if t.pid == pid), None)

    def check_partition(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        """KIP-890's check: a transactional batch belongs to its producer's open transaction."""
        txn = self.of_producer(pid)
        if txn is None:
            return INVALID_PRODUCER_ID_MAPPING
        if epoch < txn.epoch:
            return INVALID_PRODUCER_EPOCH
        if txn.state != "ongoing" or (topic, partition) not in txn.partitions:
            return INVALID_TXN_STATE
        return NONE

    def init_producer_id(
        self, txn_id: str | None, timeout_ms: int, process: Any = None
    ) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        if txn_id is None:  # an idempotent producer (a tool's: dlq replay)
            pid = next(self._pids)
            self.process_of[pid] = process
            return NONE, pid, 0
        self._check_owner(txn_id, process)
        txn = self.txns.get(txn_id)
        if txn is None:
            txn = self.txns[txn_id] = Txn(txn_id, next(self._pids), -1, timeout_ms / 1000)
        txn.timeout_s = timeout_ms / 1000
        if txn.state in ("prepare_commit", "prepare_abort"):
            return CONCURRENT_TRANSACTIONS, -1, -1
        if txn.state == "ongoing":
            txn.epoch += 1  # fences the old producer at once; its transaction is aborted
            self.broker.trace(
                f"broker: {txn_id} re-initialised: aborting its open transaction (epoch {txn.epoch})"
            )
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
            txn.started = self.broker.now()
            txn.partitions = set()
            txn.groups = set()

    def add_partitions(
        self, txn_id: str, pid: int, epoch: int, tps: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        error, txn = self._txn_for(txn_id, pid, epoch)
        if txn is None:
            return dict.fromkeys(tps, error)
        injected = self.broker.injected_error("add-partitions", txn_id)
        if not injected and self.broker.now() < self.broker.storm_until:
            injected = INVALID_TXN_STATE  # a storm: every transaction's producer dies for a while
        if injected:
            return dict.fromkeys(tps, injected)
        self._open(txn)
        result: dict[tuple[str, int], int] = {}
        for tp in tps:
            if self.broker.log(*tp) is None:
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
        error = self.broker.coordinator.check_member(group_id, *member)
        if error:
            self.broker.trace(
                f"broker: {txn_id}: offsets of group {group_id} for generation {member[0]} refused ({error})"
            )
            return error
        injected = self.broker.injected_error("offsets", txn_id)
        if injected:
            return injected
        group = self.broker.coordinator.group(group_id)
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
            injected = self.broker.injected_error("end-txn", txn_id) or self.broker.injected_error(
                "end-txn-retry", txn_id
            )
            if injected:
                return injected
            if self.broker.take_injected("end-txn-lost", txn_id) is not None:
                self.broker.trace(
                    f"broker: {txn_id}: commit completed, its reply lost; the id is fenced (injected)"
                )
                self._end(txn, commit=True)
                self.broker.lose_reply = True
                self._fence_when_ended(txn_id)
                return NONE
        self._end(txn, commit=commit)
        return NONE

    def _fence_when_ended(self, txn_id: str) -> None:
        """Another producer initialises ``txn_id`` as soon as its transaction has ended: its epoch moves on."""
        txn = self.txns[txn_id]
        error, _, _ = self.init_producer_id(txn_id, int(txn.timeout_s * 1000))
        if error == CONCURRENT_TRANSACTIONS:
            self.broker.later(0.005, self._fence_when_ended, txn_id)

    def _end(self, txn: Txn, *, commit: bool) -> None:
        """PrepareCommit/PrepareAbort now; the markers (and the offsets) a moment later."""
        txn.state = "prepare_commit" if commit else "prepare_abort"
        delay = self.broker.rng.uniform(*self.marker_delay)
        self.broker.later(delay, self._complete, txn, commit, txn.epoch)

    def _complete(self, txn: Txn, commit: bool, epoch: int) -> None:
        """The group's offsets first (the group coordinator's marker), then each partition's marker, one by
        one: a reader of the offsets may find the data partitions' transaction still open for a moment."""
        if self.broker.down:  # markers are written once the broker is back
            self.broker.later(0.5, self._complete, txn, commit, epoch)
            return
        for group_id in sorted(txn.groups):
            group = self.broker.coordinator.group(group_id)
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
            self.broker.later(
                self.broker.rng.uniform(*self.marker_spread),
                self._mark,
                txn,
                commit,
                epoch,
                (topic, partition),
                left,
            )

    def _mark(self, txn: Txn, commit: bool, epoch: int, where: tuple[str, int], left: list[int]) -> None:
        """One partition's marker; the transaction is complete once the last has landed."""
        if self.broker.down:
            self.broker.later(0.5, self._mark, txn, commit, epoch, where, left)
            return
        log = self.broker.log(*where)
        if log is not None:
            log.append_marker(txn.pid, epoch, COMMIT if commit else ABORT, self.broker.now_ms())
        left[0] -= 1
        if left[0] == 0:
            txn.state = "complete_commit" if commit else "complete_abort"

    def _abort_timed_out(self) -> None:
        self._scan = self.broker.later(TXN_ABORT_SCAN_S, self._abort_timed_out)
        if self.broker.down:
            return
        now = self.broker.now()
        for txn in self.txns.values():
            if txn.state == "ongoing" and now - txn.started > txn.timeout_s:
                txn.epoch += 1
                self.broker.trace(
                    f"broker: {txn.txn_id} open {now - txn.started:.1f}s: timed out, aborted, epoch {txn.epoch}"
                )
                self._end(txn, commit=False)
