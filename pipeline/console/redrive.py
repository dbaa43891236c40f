"""Redrives from the console: ``pipeline dlq replay``'s own code, then what became of each record.

A redrive replays the chosen DLQ records with :func:`pipeline.ops.dlq.replay`
and logs who ran it. Before replaying it notes the end of every audit
partition; the result page then reads the audit from there and finds each
replayed record's delivery by its ``replayed_from``: ``first``,
``duplicate``, or ``invalid`` again (with the reason). Runs are kept in
memory while the console runs.
"""

from __future__ import annotations

import io
import itertools
import logging
import time
from dataclasses import dataclass, field

import orjson
from aiokafka import TopicPartition

from pipeline.console.settings import User
from pipeline.kafka.admin import partition_count
from pipeline.kafka.clients import started_reader
from pipeline.kafka.partitioner import owner_partition
from pipeline.ops.dlq import Replayed, replay
from pipeline.records.dlq import DlqFilter
from pipeline.topology import Topology

log = logging.getLogger(__name__)
MAX_RUNS = 200


@dataclass
class RedriveRun:
    """One redrive: who ran it, when, what it replayed and skipped, and where the audit stood before."""

    id: int
    who: str
    at_ms: int
    replayed: list[Replayed] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    audit_starts: dict[int, int] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)  # where -> outcome, once seen

    @property
    def done(self) -> bool:
        """Whether every replayed record's delivery has been seen in the audit."""
        return all(r.where in self.outcomes for r in self.replayed)


class Redrives:
    """Runs redrives and follows their outcomes."""

    def __init__(self, bootstrap: str, topology: Topology) -> None:
        self.bootstrap = bootstrap
        self.topology = topology
        self.runs: dict[int, RedriveRun] = {}
        self._ids = itertools.count(1)

    async def run(self, records: frozenset[tuple[int, int]], user: User, remote: str) -> RedriveRun:
        """Replay the DLQ records ``records`` (``(partition, offset)``) as ``user``; log it."""
        who = f"{user.name} ({user.role}) from {remote}"
        run = RedriveRun(next(self._ids), who, int(time.time() * 1000))
        log.info(
            "redrive %s by %s: %d DLQ records of %s", run.id, who, len(records), self.topology.topics.dlq
        )
        run.audit_starts = await self._audit_ends()
        report = await replay(
            self.bootstrap, self.topology, DlqFilter(records=records), dry_run=False, out=io.StringIO()
        )
        run.replayed, run.skipped = report.records, report.skipped
        log.info(
            "redrive %s by %s: replayed %d (%s), skipped %d",
            run.id,
            who,
            report.count,
            ", ".join(f"{r.where} {r.key}" for r in report.records[:20]),
            len(report.skipped),
        )
        self.runs[run.id] = run
        while len(self.runs) > MAX_RUNS:
            self.runs.pop(min(self.runs))
        return run

    async def _audit_ends(self) -> dict[int, int]:
        audit = self.topology.topics.audit
        count = await partition_count(self.bootstrap, audit) or 0
        tps = [TopicPartition(audit, p) for p in range(count)]
        consumer = await started_reader(self.bootstrap)
        try:
            ends = await consumer.end_offsets(tps) if tps else {}
        finally:
            await consumer.stop()
        return {tp.partition: offset for tp, offset in ends.items()}

    async def follow(self, run: RedriveRun) -> RedriveRun:
        """Read the audit since the run for the deliveries of its replayed records."""
        if run.done:
            return run
        audit = self.topology.topics.audit
        count = len(run.audit_starts)
        partitions = (
            {owner_partition(r.key.encode(), count) for r in run.replayed if r.key is not None}
            if all(r.key is not None for r in run.replayed)
            else set(run.audit_starts)
        )
        wanted = {r.where for r in run.replayed} - set(run.outcomes)
        consumer = await started_reader(self.bootstrap)
        try:
            tps = [TopicPartition(audit, p) for p in sorted(partitions) if p in run.audit_starts]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, run.audit_starts[tp.partition])
            left = {tp for tp in tps if run.audit_starts[tp.partition] < ends[tp]}
            deadline = time.monotonic() + 10
            while left and wanted and time.monotonic() < deadline:
                batch = await consumer.getmany(*left, timeout_ms=300)
                for tp, got in batch.items():
                    for record in got:
                        _note(run, wanted, record.value)
                        if record.offset + 1 >= ends[tp]:
                            left.discard(tp)
        finally:
            await consumer.stop()
        return run


def _note(run: RedriveRun, wanted: set[str], value: bytes | None) -> None:
    try:
        audit = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return
    if not isinstance(audit, dict):
        return
    where = audit.get("replayed_from")
    if isinstance(where, str) and where in wanted and audit.get("stage") != "effect":
        outcome = str(audit.get("outcome"))
        run.outcomes[where] = f"{outcome} ({audit['reason']})" if audit.get("reason") else outcome
        wanted.discard(where)
