"""Time that jumps: a seed whose runs cross TTLs and expiry buckets, drawn as a :class:`TimePlan`.

The classic scenarios last seconds to minutes of virtual time against a seven-day TTL:
nothing ever expires. A time plan makes expiry happen, cheaply:

- *short TTLs*: the sources' TTL an hour to three (the least a topology takes), the effect
  routes' an hour or two, so a store's buckets are an hour wide (their least);
- *record time running ahead of virtual time* (a backlog replayed, an ingress that buffered):
  record timestamps start hours to two days behind the wall clock and catch up with it by the
  end of the schedule, so seconds of virtual time are hours of stream time; record timestamps
  are fixed by the workload, and a few keys get copies exactly at their TTL and a millisecond
  either side of it; or record time stays that far behind (a backlog days old worked through
  at its own pace: the changelog's retention runs on the broker's clock meanwhile);
- *every worker down for longer than a bucket, its grace and the TTL*, SIGTERMed or
  SIGKILLed, while records keep coming (the records of a stretch of the schedule are spread
  over the downtime, and some keys are delivered again during it): the workers come back to
  a backlog hours long, with the wall clock hours past its records;
- or, in some seeds of the time mix, *every worker down for longer than the changelog's
  retention* (the largest TTL plus a day) with nothing delivered meanwhile (a ``silent``
  downtime: a provider and a pipeline down together): the broker deletes every changelog
  segment but the active one on its clock, so a store kept from before (a standby behind, a
  partition moved away earlier) starts behind its changelog's log start when it is read again;
- *clock jumps* on one worker: its wall clock (``WorkerIO.wall``, which bounds record times
  and stamps changelog records) steps minutes to hours ahead or back, and later back again;
- the changelog stamped by the broker (``message.timestamp.type=LogAppendTime``).

Everything is drawn from the seed; the world carries out the downtime and the jumps
(``tests/simulation/world.py``), the broker model the retention and the stamping.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from random import Random

from tests.simulation.faults import Fault
from tests.simulation.loop import EPOCH_S
from tests.simulation.workload import HOUR_MS, Delivery, Workload

DOWNTIME = "downtime"  # every worker down for hours (SIGTERM or SIGKILL), started again after
CLOCK_JUMP = "clock-jump"  # one worker's wall clock steps by ``detail`` seconds, and back after ``duration``
EPOCH_MS = int(EPOCH_S * 1000)


@dataclass(frozen=True)
class TimePlan:
    """What a seed does with time (see the module docstring)."""

    ttl_h: int  # the sources' TTL, hours
    effect_ttl_h: int  # the effect routes' TTL, hours
    span_ms: int  # how far behind the wall clock record time starts (0: record time is the wall clock)
    steady: bool  # record time stays ``span_ms`` behind (a backlog days old worked through at its own pace)
    boundary: bool  # copies of a few keys at their TTL exactly, and a millisecond either side
    downtime: Fault | None
    jumps: tuple[Fault, ...]
    log_append_time: bool  # the changelogs stamped by the broker
    # the downtime outlasts the changelog's retention, and nothing is delivered during it
    silent: bool = False

    @property
    def ttl_ms(self) -> int:
        return self.ttl_h * HOUR_MS

    def describe(self) -> str:
        parts = [f"TTL {self.ttl_h}h (effects {self.effect_ttl_h}h)"]
        if self.span_ms:
            how = "steadily" if self.steady else "from"
            parts.append(f"record time {how} {self.span_ms / HOUR_MS:.1f}h behind the clock")
        if self.boundary:
            parts.append("copies at the TTL boundary")
        if self.log_append_time:
            parts.append("changelogs LogAppendTime")
        if self.silent:
            parts.append("a silent downtime longer than the changelog's retention")
        return ", ".join(parts)

    def offsets(self) -> tuple[float, float]:
        """The least and greatest a worker's clock is off by (seconds), 0 included."""
        steps = [0.0, *(float(jump.detail) for jump in self.jumps)]
        return min(steps), max(steps)


def draw(rng: Random, *, duration: float, workers: int) -> TimePlan:
    """A time plan for a schedule of ``duration`` seconds."""
    ttl_h = rng.choice((1, 1, 2, 3))
    effect_ttl_h = rng.choice((1, 2))
    span_ms = rng.choice((0, 6, 12, 30, 50)) * HOUR_MS if rng.random() < 0.75 else 0
    downtime = _downtime(rng, duration, max(ttl_h, effect_ttl_h)) if rng.random() < 0.45 else None
    jumps = []
    for _ in range(rng.choice((0, 0, 1, 2))):
        offset = rng.choice((-3 * 3600, -40 * 60, 20 * 60, 50 * 60))
        jumps.append(
            Fault(
                rng.uniform(0.5, duration),
                CLOCK_JUMP,
                rng.randrange(workers),
                rng.choice((0.0, rng.uniform(2.0, 20.0))),
                detail=str(offset),
            )
        )
    steady = span_ms > 0 and rng.random() < 0.35
    return TimePlan(
        ttl_h=ttl_h,
        effect_ttl_h=effect_ttl_h,
        span_ms=span_ms,
        steady=steady,
        boundary=span_ms > 0 and not steady and rng.random() < 0.8,
        downtime=downtime,
        jumps=tuple(jumps),
        log_append_time=rng.random() < 0.4,
    )


def _downtime(rng: Random, duration: float, ttl_h: int) -> Fault:
    """Every worker down, from 20-70% into the schedule, for longer than a bucket, its grace and ``ttl_h``."""
    least = (2 + ttl_h) * 3600
    at = rng.uniform(0.2, 0.7) * duration
    return Fault(at, DOWNTIME, 0, rng.uniform(least, least + 4 * 3600), detail=rng.choice(("term", "kill")))


def with_downtime(plan: TimePlan, rng: Random, *, duration: float) -> TimePlan:
    """``plan`` with a downtime drawn from ``rng`` when it drew none (a mix that wants one in every seed)."""
    if plan.downtime is not None:
        return plan
    return replace(plan, downtime=_downtime(rng, duration, max(plan.ttl_h, plan.effect_ttl_h)))


def silence(plan: TimePlan, retention_ms: int, rng: Random) -> TimePlan:
    """``plan`` with its downtime made silent and longer than the changelog's ``retention_ms`` by an hour
    to four (no copies at the TTL boundary: one would be delivered during it)."""
    if plan.downtime is None:
        return plan
    longer = replace(plan.downtime, duration=retention_ms / 1000 + rng.uniform(3600.0, 4 * 3600.0))
    return replace(plan, downtime=longer, silent=True, boundary=False)


def apply(plan: TimePlan, load: Workload, faults: list[Fault], rng: Random) -> list[Fault]:
    """Reshape ``load`` for ``plan`` (in place) and return the faults moved past a downtime, with the plan's own."""
    if plan.downtime is not None and plan.silent:
        faults = _after_downtime(plan.downtime, load, faults)
    elif plan.downtime is not None:
        faults = _around_downtime(plan.downtime, load, faults, rng)
    if plan.span_ms:
        _backfill(plan, load, rng)
    return sorted([*faults, *plan.jumps, *([plan.downtime] if plan.downtime else [])], key=lambda f: f.at)


def _around_downtime(down: Fault, load: Workload, faults: list[Fault], rng: Random) -> list[Fault]:
    """Records of a stretch after the downtime begins are spread over it; later ones come after it; some keys
    first delivered before it are delivered again during it. Faults after its start move past it."""
    start, length = down.at, down.duration
    stretch = max((load.duration - start) * 0.3, 0.5)

    def moved(at: float) -> float:
        if at < start:
            return at
        if at < start + stretch:
            return start + (at - start) * length / stretch
        return at + length - stretch

    deliveries = [replace(d, at=moved(d.at)) for d in load.deliveries]
    before = [d for d in deliveries if d.at < start and d.poison is None and d.cause is None]
    again = []
    for n, d in enumerate(rng.sample(before, min(len(before), rng.randint(2, 8)))):
        again.append(d.copy(f"d{n}", start + rng.uniform(0.0, min(length, 2 * 3600)), None))
    load.deliveries = sorted([*deliveries, *again], key=lambda d: d.at)
    return [replace(f, at=f.at + length) if f.at >= start else f for f in faults]


def _after_downtime(down: Fault, load: Workload, faults: list[Fault]) -> list[Fault]:
    """A silent downtime: deliveries and faults from its start on move past it. A moved delivery stamped
    behind its producer's clock is stamped on time, and one before it is never stamped ahead: a copy
    dated back into a claim the changelog's retention deleted meanwhile is what docs/operations.md
    ("Expiry and disk") tells the operator to cover with ``retention.ms``, not something the pipeline
    can keep. A record dated ahead before the downtime would be one: it moves stream time up to the
    worker's clock plus ``--max-clock-skew``, a whole backlog span ahead of the records' time, so the
    records after the downtime (as far behind their clock as before) are still inside the windows of
    claims made then (time seed 10090: 30 h behind, an hour ahead, a 29.8 h downtime)."""
    start, length = down.at, down.duration
    load.deliveries = [
        replace(d, at=d.at + length, timestamp_skew_ms=max(d.timestamp_skew_ms, 0))
        if d.at >= start
        else replace(d, timestamp_skew_ms=min(d.timestamp_skew_ms, 0))
        for d in load.deliveries
    ]
    return [replace(f, at=f.at + length) if f.at >= start else f for f in faults]


def _backfill(plan: TimePlan, load: Workload, rng: Random) -> None:
    """Record time from ``span_ms`` behind the wall clock to level with it at the end: each record stamped
    accordingly (its skew added); a few keys delivered again at their TTL exactly and a millisecond either side."""
    end = max(load.duration, 1.0)
    rate = 1000.0 if plan.steady else 1000.0 + plan.span_ms / end  # record ms per virtual second

    def stamp(at: float) -> int:
        return EPOCH_MS - plan.span_ms + int(at * rate)

    deliveries = [replace(d, timestamp_ms=stamp(d.at) + d.timestamp_skew_ms) for d in load.deliveries]
    extra: list[Delivery] = []
    if plan.boundary:
        firsts: dict[str, Delivery] = {}
        for d in deliveries:
            if d.poison is None and d.cause is None and d.effect_key is None and not d.timestamp_skew_ms:
                firsts.setdefault(d.event_key, d)
        ttl = plan.ttl_ms
        early = [
            d
            for d in firsts.values()
            if d.timestamp_ms is not None and d.timestamp_ms + ttl + 1 <= stamp(end)
        ]
        for n, first in enumerate(rng.sample(early, min(len(early), rng.randint(2, 5)))):
            base = (first.timestamp_ms or 0) + ttl
            for delta in (-1, 0, 1):
                at = (base + delta - EPOCH_MS + plan.span_ms) / rate
                extra.append(first.copy(f"b{n}{'-0+'[delta + 1]}", at, base + delta))
    load.deliveries = sorted([*deliveries, *extra], key=lambda d: d.at)
