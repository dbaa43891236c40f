"""A faulty handler: records whose handling raises (a bug in the worker's handling, not an invalid record).

The world builds every worker with :func:`faulty` (``Worker(classifier=...)``): its classifier
raises ``RuntimeError`` on a record whose body carries a fault mark, which the worker must treat as
a handler failure: abort the transaction, redo it with that record as poison, and dead-letter it
alone as ``handler-error`` (:mod:`pipeline.worker.poison`). Two marks:

- :data:`ALWAYS`: the handler fails on it in every worker: it is poison (``handler-error``), and
  a redrive of it goes back to the DLQ;
- :data:`UNTIL_FIX`: a bug a redrive's fix removes (a deploy of fixed code: the workers started
  after the fix handle it): until then it goes to the DLQ as ``handler-error``, and ``dlq replay
  --reason handler-error`` after the fix gives its key one command (a redrive cause,
  :data:`tests.simulation.redrive.HANDLER`).
"""

from __future__ import annotations

from random import Random
from typing import TYPE_CHECKING

import orjson

from pipeline.contract import Delivery as Record
from pipeline.kafka.partitioner import owner_partition
from pipeline.topology import Topology
from pipeline.worker.classify import Classified, Classifier, ClassifierFactory, Partitioner
from tests.simulation.workload import PLAIN_EVENT, SIM_ID, Delivery, Workload

if TYPE_CHECKING:
    from tests.simulation.timeline import TimePlan

REASON = "handler-error"
ALWAYS = b'"sim_fault":"always"'
UNTIL_FIX = b'"sim_fault":"until-fix"'
#: How far ahead of the clock some records the handler fails on are dated: inside the worker's
#: default skew horizon (an hour), outside the DLQ topic's bound after a timestamp refuse-outputs fault.
AHEAD_MS = (25 * 60_000, 50 * 60_000)
DLQ_AFTER_MS = 20 * 60_000
#: A DLQ bound stays this far past the furthest any worker's clock runs ahead (see :func:`dlq_after_ms`).
CLOCK_MARGIN_MS = 10 * 60_000


def dlq_after_ms(time: TimePlan | None) -> int:
    """The DLQ topic's ``message.timestamp.after.max.ms`` a ``refuse-outputs timestamps`` fault sets:
    :data:`DLQ_AFTER_MS`, or wider than the furthest a clock jump puts a worker's clock ahead. A worker
    restamps a refused DLQ record with its own clock; a host whose clock runs ahead of the broker's by
    more than the topic's bound can write no restamped record at all, and exits with its one line at each
    restart: a deployment whose clocks disagree, which the operator's NTP answers, not the worker
    (default seed 14338: a clock 50 min ahead against a 20-minute bound)."""
    ahead_ms = int(max(time.offsets()) * 1000) if time is not None else 0
    return DLQ_AFTER_MS if ahead_ms < DLQ_AFTER_MS else ahead_ms + CLOCK_MARGIN_MS


class FaultyHandler(Classifier):
    """The topology's classifier, except that it raises on a record with a fault mark it has not been fixed of."""

    def __init__(
        self, topology: Topology, partitioner: Partitioner, *, input_partitions: int, fixed: bool
    ) -> None:
        super().__init__(topology, partitioner, input_partitions=input_partitions)
        self.fixed = fixed

    def classify(self, delivery: Record) -> Classified:
        """Raise on a marked record; classify the others as the worker's own classifier does."""
        value = delivery.value
        if b'"sim_fault"' in value and (ALWAYS in value or (UNTIL_FIX in value and not self.fixed)):
            raise RuntimeError("sim: the handler fails on this record")
        return super().classify(delivery)


def faulty(*, fixed: bool) -> ClassifierFactory:
    """What builds a worker's classifier: a :class:`FaultyHandler`, ``fixed`` of :data:`UNTIL_FIX` or not."""

    def build(topology: Topology, partitioner: Partitioner, *, input_partitions: int) -> Classifier:
        return FaultyHandler(topology, partitioner, input_partitions=input_partitions, fixed=fixed)

    return build


def add_records(
    rng: Random, load: Workload, seed: int, *, fixable: bool, ahead: Random | None = None
) -> None:
    """Events the handler fails on: a few keys always, and with ``fixable`` (a redrive plan) a few until the fix;
    each sent one to three times, on its key's partition.

    With ``ahead`` (its own draws, so that the others stay as they were), some of the keys that always fail
    are dated :data:`AHEAD_MS` ahead of the clock: inside the worker's skew horizon, so the handler runs
    and fails, but outside a DLQ topic bound a ``refuse-outputs`` fault sets mid-run
    (:data:`DLQ_AFTER_MS`). Their DLQ record is then refused for its timestamp, and must be redone
    stamped with the current time (:meth:`pipeline.worker.poison.PoisonTracker.commit_failed`)."""
    extra: list[Delivery] = []
    end = max(load.duration, 1.0)
    kinds = [("h", ALWAYS)] + ([("u", UNTIL_FIX)] if fixable else [])
    for prefix, mark in kinds:
        for i in range(rng.randint(2, 6)):
            key = f"stripe:evt_{seed}_{prefix}{i}"
            first = rng.uniform(0, end)
            skew = (
                ahead.randint(*AHEAD_MS)
                if ahead is not None and mark == ALWAYS and ahead.random() < 0.5
                else 0
            )
            for c in range(rng.choice((1, 1, 2, 3))):
                sim_id = f"{prefix}{i}.{c}"
                body = orjson.dumps({"id": key.split(":", 1)[1], "type": PLAIN_EVENT, "pending_webhooks": c})
                body = body[:-1] + b"," + mark + b"}"
                extra.append(
                    Delivery(
                        sim_id=sim_id,
                        at=first + (rng.uniform(0, 8) if c else 0),
                        partition=owner_partition(key.encode(), load.partitions),
                        key=key.encode(),
                        value=body,
                        headers=[("source", b"stripe"), (SIM_ID, sim_id.encode())],
                        timestamp_skew_ms=skew,
                        event_key=key,
                        effect_key=None,
                        poison=REASON if mark == ALWAYS else None,
                        misplaced=False,
                        cause=REASON if mark == UNTIL_FIX else None,
                    )
                )
    load.add(extra)
