"""Who serves each partition and who keeps its standby copies: the group leader's plan, pure.

Every member reports the changelog position of every store it holds (active,
standby, or left on its disk) and which partitions it served in the last
generation (:class:`Claim`). :func:`plan` then:

1. keeps the count of active partitions balanced: each member serves
   ``T // M`` or ``T // M + 1`` of the ``T`` partitions (of the topics it
   subscribes to);
2. within that, gives each partition to the member whose copy is most current:
   the smallest lag behind the best copy any member holds, every lag up to
   :data:`CAUGHT_UP` counting as none (Kafka Streams' ``acceptable.recovery.lag``:
   a copy a few records or a commit marker behind replays them in milliseconds,
   and moving a partition for it would push another one onto a member without a
   copy); a member holding no copy comes last. Ties go to the member that served
   it before (sticky), then the most current copy, then
   round-robin, so that a group of fresh members spreads as the roundrobin
   assignor does;
3. gives each partition ``replicas`` standbys on other members (never its
   active one, never twice on one member), preferring members keeping the
   fewest standbys of the same active member, then warm copies, then the
   members with the least work so far (actives and standbys), and no member
   beyond its even share while another has room; members that do not speak this
   protocol (older workers: no claim) get none. Spreading comes before warmth:
   when a member dies, balance gives each survivor only its share of the dead
   member's partitions, so its standbys must sit on different survivors to be
   promoted; a cold standby is warm after one replay in the background, while a
   failover to a member without a copy replays the whole store in the foreground.

Pairs are taken greedily, best first; the plan is deterministic for the same
claims, so every leader elected after a failure plans the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only named in annotations: planning loads no Kafka client
    from aiokafka import TopicPartition

NO_COPY = 1 << 62  # the lag of a member that holds no copy of a partition
CAUGHT_UP = 10_000  # changelog records behind the best copy that still count as current


@dataclass(frozen=True)
class Claim:
    """What one member says in its JoinGroup metadata."""

    subscription: frozenset[str]
    positions: Mapping[TopicPartition, int] = field(default_factory=dict)  # changelog offset per store
    active: frozenset[TopicPartition] = frozenset()  # served in the last generation
    standby_capable: bool = True  # False: an older worker, which would ignore standby assignments


@dataclass
class Plan:
    """One member's share: the partitions it serves and those it keeps standbys of."""

    active: list[TopicPartition] = field(default_factory=list)
    standby: list[TopicPartition] = field(default_factory=list)


def plan(
    partitions: Iterable[TopicPartition], members: Mapping[str, Claim], *, replicas: int
) -> dict[str, Plan]:
    """Each member's plan (every member gets one, possibly empty)."""
    names = sorted(members)
    plans = {name: Plan() for name in names}
    if not names:
        return plans
    tasks = sorted(partitions)
    lags = _lags(tasks, members)
    owner = _actives(tasks, names, members, lags)
    for name, task in sorted((name, task) for task, name in owner.items()):
        plans[name].active.append(task)
    _standbys(tasks, names, members, lags, owner, replicas, plans)
    return plans


def _lags(
    tasks: Sequence[TopicPartition], members: Mapping[str, Claim]
) -> dict[tuple[str, TopicPartition], int]:
    """How far each member's copy of each partition is behind the best copy (NO_COPY without one)."""
    lags: dict[tuple[str, TopicPartition], int] = {}
    for task in tasks:
        held = {name: claim.positions[task] for name, claim in members.items() if task in claim.positions}
        best = max(held.values(), default=0)
        for name in members:
            lags[(name, task)] = best - held[name] if name in held else NO_COPY
    return lags


def _actives(
    tasks: Sequence[TopicPartition],
    names: Sequence[str],
    members: Mapping[str, Claim],
    lags: Mapping[tuple[str, TopicPartition], int],
) -> dict[TopicPartition, str]:
    """Each partition's active member: balanced counts, a current copy (within CAUGHT_UP) first, then sticky,
    then the most current, then round-robin."""
    index = {name: i for i, name in enumerate(names)}
    eligible = {task: [n for n in names if task.topic in members[n].subscription] for task in tasks}
    pairs = sorted(
        (
            (
                _behind(lags[(name, task)]),
                0 if task in members[name].active else 1,
                lags[(name, task)],
                (index[name] - t) % len(names),
                name,
                task,
            )
            for t, task in enumerate(tasks)
            for name in eligible[task]
        ),
    )
    base, extra = divmod(len(tasks), len(names))
    counts = dict.fromkeys(names, 0)
    larger = 0  # members given base + 1
    owner: dict[TopicPartition, str] = {}
    for *_, name, task in pairs:
        if task in owner:
            continue
        if counts[name] < base or (counts[name] == base and larger < extra):
            larger += counts[name] == base
            counts[name] += 1
            owner[task] = name
    for task in tasks:  # uneven subscriptions: whatever balance left over goes to the least loaded
        if task not in owner and eligible[task]:
            name = min(eligible[task], key=lambda n: (counts[n], lags[(n, task)], index[n]))
            counts[name] += 1
            owner[task] = name
    return owner


def _standbys(
    tasks: Sequence[TopicPartition],
    names: Sequence[str],
    members: Mapping[str, Claim],
    lags: Mapping[tuple[str, TopicPartition], int],
    owner: Mapping[TopicPartition, str],
    replicas: int,
    plans: dict[str, Plan],
) -> None:
    """``replicas`` standbys per partition, on members other than its active one, spread evenly."""
    capable = [n for n in names if members[n].standby_capable]
    if replicas <= 0 or not capable:
        return
    index = {name: i for i, name in enumerate(names)}
    load = dict.fromkeys(capable, 0)
    work = {n: len(plans[n].active) for n in capable}  # actives and standbys: spread the whole load
    beside: dict[
        tuple[str, str | None], int
    ] = {}  # (member, active member): standbys it keeps of its partitions
    cap = -(-len(tasks) * replicas // len(capable))  # the even share, rounded up
    for t, task in enumerate(tasks):
        candidates = [n for n in capable if n != owner.get(task) and task.topic in members[n].subscription]
        chosen = sorted(
            candidates,
            key=lambda n: (
                load[n] >= cap,
                beside.get((n, owner.get(task)), 0),  # spread first: see the module
                lags[(n, task)] == NO_COPY,
                work[n],
                lags[(n, task)],
                (index[n] - t) % len(names),
            ),
        )[:replicas]
        for name in chosen:
            load[name] += 1
            work[name] += 1
            beside[(name, owner.get(task))] = beside.get((name, owner.get(task)), 0) + 1
            plans[name].standby.append(task)


def _behind(lag: int) -> int:
    """A copy's lag as the active placement weighs it: none when within :data:`CAUGHT_UP`."""
    return 0 if lag <= CAUGHT_UP else lag
