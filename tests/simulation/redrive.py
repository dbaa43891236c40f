"""Redrives as workload steps, drawn as a :class:`RedrivePlan`: records a fix makes valid, the fix, and ``dlq
replay`` runs.

Three causes the world can fix while the workers run, as an operator would:

- ``source``: records of a source the topology lacks (``acme``, keyed ``acme:<id>``) go to the
  DLQ as ``unknown-source``; the fix adds the source to the topology and restarts the workers
  one by one;
- ``size``: the command topic takes records of 1,200 bytes at most, so commands of large
  bodies go to the DLQ as ``too-large`` (their keys unclaimed); while the workers run the
  other command topics (the effect routes') drop to that limit too, so the broker refuses
  the effect stage's large commands and they go to the DLQ as ``unproducible`` from the
  effect stage (a replay sends them back to the effects topic); the fix raises every limit
  and restarts the workers (they read the limits at start);
- ``handler`` (added by :mod:`tests.simulation.handlers` to some plans): records whose handling
  raises go to the DLQ as ``handler-error``; the fix is a deploy of fixed code (the workers
  restarted one by one handle them).

Then ``pipeline dlq replay --reason ...`` runs, the real code (``pipeline/ops/dlq.py``) as a
process in the world over the simulated network: sometimes before the fix (the records go
back to the DLQ), after it once or twice, sometimes two at once, sometimes SIGKILLed midway
or cut off by a broker outage (an operator then runs it again), and once more when the
schedule is over, which must leave nothing of the fixed causes unreplayed. With a time plan
the records redriven are hours older than their TTL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from random import Random

import orjson

from pipeline.kafka.partitioner import owner_partition
from tests.simulation.faults import RECONFIGURE, Fault
from tests.simulation.workload import PLAIN_EVENT, SIM_ID, Delivery, Workload

REPLAY = (
    "replay"  # dlq replay runs: target = how many at once, duration = SIGKILL after (0: none), detail when,
)
# steps = seconds the broker goes away for as the (first) run sends its first fetch (0: it does not)
CONSOLE = "console-redrive"  # console redrives (tests/simulation/console.py): target = how many at once,
# steps = seconds the broker goes away for as the first begins to read the DLQ (0: it does not)
FIX = "fix"  # the causes fixed: the topology given the source, the command topics' limit raised, workers restarted
SOURCE, SIZE, HANDLER = "source", "size", "handler"
FIXED_SOURCE = "acme"
#: What each cause's records are dead-lettered as until the fix: what the replays ask for.
REASONS = {SOURCE: ("unknown-source",), SIZE: ("too-large", "unproducible"), HANDLER: ("handler-error",)}
COMMAND_LIMIT = 1200  # the command topics' max.message.bytes until the size fix
BIG_PAD = 1500  # a body this much padded makes a command larger than COMMAND_LIMIT


@dataclass(frozen=True)
class RedrivePlan:
    """The causes a seed fixes (its fix and replay runs are faults of the schedule: FIX, REPLAY)."""

    causes: tuple[str, ...]

    @property
    def reasons(self) -> frozenset[str]:
        return frozenset(reason for cause in self.causes for reason in REASONS[cause])

    def describe(self) -> str:
        return f"causes {', '.join(self.causes)} (fixed by 'fix', replayed by 'replay'), a last replay at the end"


def draw(rng: Random, *, duration: float, small_dlq: bool) -> tuple[RedrivePlan, list[Fault]]:
    """A redrive plan for a schedule of ``duration`` seconds, with its fix, replay runs and the broker outages
    that begin while half of the runs go (some longer than a replay waits): most just as the run begins to
    read the DLQ, the others a moment after it began. With a ``small_dlq`` (4 KiB) the
    large bodies would be truncated in the DLQ, which no replay can rebuild: no size cause then."""
    causes = rng.choice(((SOURCE,), (SIZE,), (SOURCE, SIZE)))
    if small_dlq:
        causes = (SOURCE,)
    fix_at = rng.uniform(0.3, 0.8) * duration
    steps = [Fault(fix_at, FIX)]
    if SIZE in causes:  # the other command topics too, while the workers run: they learn it from refusals
        steps.append(Fault(rng.uniform(0.05, 0.9) * fix_at, RECONFIGURE, detail="limits-down"))
    if rng.random() < 0.3:
        steps.append(Fault(rng.uniform(0.1, 1.0) * fix_at, REPLAY, 1, detail="before the fix"))
    for _ in range(rng.choice((1, 1, 2))):
        at = fix_at + rng.uniform(1.0, 15.0)
        kill = rng.uniform(0.1, 2.0) if rng.random() < 0.2 else 0.0
        steps.append(Fault(at, REPLAY, 2 if rng.random() < 0.5 else 1, kill, detail="after the fix"))
    for n, run in enumerate(steps):
        if run.kind != REPLAY or rng.random() >= 0.5:
            continue
        length = rng.uniform(61.0, 95.0) if rng.random() < 0.25 else rng.uniform(0.5, 12.0)
        if rng.random() < 0.6:  # as it has read its end offsets and begins to read
            steps[n] = replace(run, steps=int(length))
        else:
            steps.append(Fault(run.at + rng.uniform(0.0, 1.5), "outage", 0, length))
    return RedrivePlan(causes), steps


def add_records(rng: Random, plan: RedrivePlan, load: Workload, seed: int) -> None:
    """The records of each cause: keys of the missing source, and large bodies."""
    extra: list[Delivery] = []
    end = max(load.duration, 1.0)
    if SOURCE in plan.causes:
        for i in range(rng.randint(4, 12)):
            key = f"{FIXED_SOURCE}:evt_{seed}_a{i}"
            first = rng.uniform(0, end)
            for c in range(rng.choice((1, 1, 2, 3))):
                body = orjson.dumps({"id": key.split(":", 1)[1], "type": PLAIN_EVENT, "pending_webhooks": c})
                extra.append(
                    _delivery(
                        f"a{i}.{c}", key, body, FIXED_SOURCE, first + (rng.uniform(0, 8) if c else 0), load
                    )
                )
                extra[-1] = Delivery(**{**extra[-1].__dict__, "cause": "unknown-source"})
    if SIZE in plan.causes:
        for i in range(rng.randint(3, 10)):
            key = f"stripe:evt_{seed}_z{i}"
            body = orjson.dumps({"id": key.split(":", 1)[1], "type": PLAIN_EVENT, "notes": "n" * BIG_PAD})
            first = rng.uniform(0, end)
            extra += [
                _delivery(f"z{i}.{c}", key, body, "stripe", first + (rng.uniform(0, 8) if c else 0), load)
                for c in range(rng.choice((1, 2)))
            ]
    load.add(extra)


def _delivery(sim_id: str, key: str, body: bytes, source: str, at: float, load: Workload) -> Delivery:
    return Delivery(
        sim_id=sim_id,
        at=at,
        partition=owner_partition(key.encode(), load.partitions),
        key=key.encode(),
        value=body,
        headers=[("source", source.encode()), (SIM_ID, sim_id.encode())],
        timestamp_skew_ms=0,
        event_key=key,
        effect_key=None,
        poison=None,
        misplaced=False,
    )
