"""What one seed sends: webhooks with duplicates, conflicts, poison, misplaced records and skewed clocks.

Every record carries a ``sim-id`` header (its identity through reroutes and the
DLQ) and knows what it must become, so the oracle needs nothing from the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from random import Random

import orjson

from pipeline.kafka.partitioner import owner_partition

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
SIM_ID = "sim-id"

#: The event types of the effect topology: two events that mean one payment share an effect key.
EFFECT_EVENTS = ("checkout.session.completed", "payment_intent.succeeded")
PLAIN_EVENT = "charge.succeeded"


@dataclass(frozen=True)
class Delivery:
    """One input record the workload produces."""

    sim_id: str
    at: float  # virtual seconds after the start
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]]
    timestamp_skew_ms: int  # added to the wall clock at produce time
    event_key: str  # the scoped key the worker must derive ("" for poison without one)
    effect_key: str | None  # the effect key its command is deduped by, if routed through effects
    poison: str | None  # why it must go to the DLQ, else None (valid)
    misplaced: bool
    timestamp_ms: int | None = None  # its timestamp, when the workload fixes it (then no skew is added)
    cause: str | None = None  # the DLQ reason it gets until the world fixes its cause (then it is valid)

    def copy(self, sim_id: str, at: float, timestamp_ms: int | None) -> Delivery:
        """Another delivery of this record: its own sim id, time and timestamp."""
        headers = [(n, v) for n, v in self.headers if n != SIM_ID] + [(SIM_ID, sim_id.encode())]
        return replace(self, sim_id=sim_id, at=at, timestamp_ms=timestamp_ms, headers=headers)


@dataclass
class Workload:
    deliveries: list[Delivery] = field(default_factory=list)
    partitions: int = 1
    effects: bool = False

    @property
    def duration(self) -> float:
        return max((d.at for d in self.deliveries), default=0.0)

    def describe(self) -> str:
        poison = sum(1 for d in self.deliveries if d.poison)
        keys = len({d.event_key for d in self.deliveries if not d.poison})
        skewed = sum(1 for d in self.deliveries if d.timestamp_skew_ms)
        misplaced = sum(1 for d in self.deliveries if d.misplaced)
        fixable = sum(1 for d in self.deliveries if d.cause)
        return (
            f"{len(self.deliveries)} records over {self.duration:.1f}s: {keys} keys, {poison} poison, "
            f"{misplaced} misplaced, {skewed} with skewed timestamps, {self.partitions} partitions"
            + (", effect routes" if self.effects else "")
            + (f", {fixable} invalid until a fix" if fixable else "")
        )

    def add(self, deliveries: list[Delivery]) -> None:
        """More deliveries, kept in the order of their times."""
        self.deliveries = sorted([*self.deliveries, *deliveries], key=lambda d: d.at)


def _body(event_id: str, event_type: str, *, pending: int, variant: int, payment: str, pad: int = 0) -> bytes:
    obj = {"id": payment if event_type == "payment_intent.succeeded" else f"cs_{event_id}"}
    if event_type == "checkout.session.completed":
        obj["payment_intent"] = payment
    return orjson.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "pending_webhooks": pending,  # differs between attempts, ignored by the conflict check
            "data": {"object": obj, "variant": variant, "notes": "n" * pad},
        }
    )


def draw(rng: Random, *, partitions: int, effects: bool, seed: int) -> Workload:
    """A workload for one seed."""
    load = Workload(partitions=partitions, effects=effects)
    keys = rng.randint(10, 70)
    duration = rng.uniform(4.0, 30.0)
    skew_forward = rng.random() < 0.5  # some seeds have a producer whose clock runs days ahead
    deliveries: list[Delivery] = []
    payments = [f"pi_{seed}_{i}" for i in range(max(2, keys // 3))]
    # body size: in some seeds a few commands fill a small topic's batch
    pad = rng.choice((0, 0, 300, 1500))
    serial = 0

    def next_id() -> str:
        nonlocal serial
        serial += 1
        return f"s{serial}"

    for k in range(keys):
        event_id = f"evt_{seed}_{k}"
        key = f"stripe:{event_id}"
        event_type = rng.choice(EFFECT_EVENTS) if effects and rng.random() < 0.6 else PLAIN_EVENT
        payment = rng.choice(payments)
        effect_key = None
        if event_type in EFFECT_EVENTS:
            effect_key = f"fulfil-order:{payment}"
        copies = 1 + (rng.choice((0, 0, 1, 1, 2, 3)) if rng.random() < 0.6 else 0)
        first_at = rng.uniform(0, duration)
        owner = owner_partition(key.encode(), partitions)
        for c in range(copies):
            at = first_at + (rng.uniform(0, 10) if c else 0)
            variant = 1 if (c and rng.random() < 0.1) else 0  # a different body under the same key: conflict
            value = _body(event_id, event_type, pending=c + 1, variant=variant, payment=payment, pad=pad)
            skew = 0
            roll = rng.random()
            if skew_forward and roll < 0.03:
                skew = rng.choice((60 * DAY_MS, 2 * HOUR_MS, 400 * DAY_MS))
            elif roll < 0.06:
                skew = -rng.randint(HOUR_MS, 2 * DAY_MS)
            misplaced = partitions > 1 and rng.random() < 0.04
            keyless = rng.random() < 0.05
            partition = owner if not misplaced else (owner + rng.randint(1, partitions - 1)) % partitions
            record_key = None if keyless else key.encode()
            if keyless and not misplaced:
                partition = owner  # the worker derives the key from the body and finds it in place
            deliveries.append(
                Delivery(
                    sim_id=next_id(),
                    at=at,
                    partition=partition,
                    key=record_key,
                    value=value,
                    headers=[("source", b"stripe")],
                    timestamp_skew_ms=skew,
                    event_key=key,
                    effect_key=effect_key,
                    poison=None,
                    misplaced=misplaced or (keyless and partition != owner),
                )
            )
    for _ in range(rng.randint(0, max(1, keys // 10))):
        deliveries.append(
            _poison(
                rng,
                duration=duration,
                partitions=partitions,
                skew_forward=skew_forward,
                key_id=f"{seed}_{serial}",
            )
        )
        deliveries[-1] = replace(deliveries[-1], sim_id=next_id())
    deliveries.sort(key=lambda d: d.at)
    load.deliveries = [
        Delivery(**{**d.__dict__, "headers": [*d.headers, (SIM_ID, d.sim_id.encode())]}) for d in deliveries
    ]
    return load


def _poison(rng: Random, *, duration: float, partitions: int, skew_forward: bool, key_id: str) -> Delivery:
    """One poison record (its sim id and sim-id header are the caller's)."""
    kind = rng.choice(("bad-body", "unknown-source", "bad-body-keyless", "bad-header"))
    at = rng.uniform(0, duration)
    partition = rng.randrange(partitions)
    headers: list[tuple[str, bytes | None]] = [("source", b"stripe")]
    key_bytes: bytes | None = f"stripe:poison_{key_id}".encode()
    value = b'{"id": "truncated'
    reason = "bad-body"
    if kind == "unknown-source":
        headers = [("source", b"nobody")]
        value = b'{"id": "x"}'
        reason = "unknown-source"
    elif kind == "bad-body-keyless":  # the key would come from the body, which cannot be read
        key_bytes = None
    elif kind == "bad-header":
        headers = [("source", b"stripe"), ("received-at", b"not-a-time")]
        value = b'{"id": "y"}'
        reason = "bad-header"
    skew = 60 * DAY_MS if (skew_forward and rng.random() < 0.3) else 0
    return Delivery(
        sim_id="",
        at=at,
        partition=partition,
        key=key_bytes,
        value=value,
        headers=headers,
        timestamp_skew_ms=skew,
        event_key="",
        effect_key=None,
        poison=reason,
        misplaced=False,
    )


def more_poison(rng: Random, load: Workload, count: int) -> None:
    """``count`` more poison records (a mix weighted toward poison), with sim ids of their own."""
    extra = []
    for n in range(count):
        found = _poison(
            rng, duration=load.duration, partitions=load.partitions, skew_forward=False, key_id=f"p{n}"
        )
        extra.append(found.copy(f"p{n}", found.at, None))
    load.add(extra)
