"""At the end of a run, every standby is warm: the promise that makes a promotion replay only the tail; and
each worker's standby counter counts what its standbys replayed.

The group's leader gives each member standby partitions (in the assignment's user_data). Once the run
has settled, each running worker must hold a standby of every partition its assignment gives it as one,
and each standby must follow its changelog to the end within :data:`WARM_LIMIT_S` of virtual time (a
standby that failed waits at most ``RETRY_MAX_S`` before it tries again). A standby that never started,
stopped following, or claims a position its store does not reflect fails the run here, though no
command is wrong: the cost of a cold standby is a promotion that replays the whole changelog.

The one standby allowed to stay cold is one the world made so: a store of another cluster planted
where it lives, which the standby never touches (``StoreIdentityError``: it keeps no standby of it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocol

from pipeline.worker.assignor import decode_standbys
from pipeline.worker.standby import RETRY_MAX_S
from tests.simulation.scenario import GROUP

if TYPE_CHECKING:
    from tests.simulation.fleet import Slot
    from tests.simulation.world import World

WARM_LIMIT_S = RETRY_MAX_S + 15.0  # a failed standby's longest wait, and a few rounds to catch up


@dataclass(frozen=True)
class Given:
    """A standby the group's current generation gives a running worker."""

    slot: Slot
    tp: TopicPartition
    changelog: str

    @property
    def name(self) -> str:
        return f"{self.tp.topic}-{self.tp.partition}"


def _given(world: World) -> Iterator[Given]:
    group = world.broker.group(GROUP)
    changelogs = world.changelog_of()
    for member in group.members.values():
        slot = next((s for s in world.slots if s.process is member.process and s.running), None)
        if slot is None or slot.worker is None or not member.assignment:
            continue
        assignment = ConsumerProtocol.ASSIGNMENT.decode(member.assignment)
        served = set(assignment.partitions())
        for tp in sorted(set(decode_standbys(assignment.user_data)) - served):
            if tp.topic in changelogs and (slot.index, tp) not in world.foreign_stores:
                yield Given(slot, tp, changelogs[tp.topic])


def _cold(world: World, given: Given) -> str | None:
    """Why ``given`` is not warm now, or None."""
    worker = given.slot.worker
    process = given.slot.process
    who = process.name if process is not None else given.slot.name
    if worker is None:
        return f"{who} is gone"
    if given.tp not in worker.standby_partitions():
        return f"{who} holds no standby of {given.name}, which its assignment gives it"
    state = worker.standby_states().get(given.name, {})
    position = state.get("position")
    log = world.broker.log(given.changelog, given.tp.partition)
    if log is None or not isinstance(position, int):
        return f"{who}'s standby of {given.name} has no position ({state})"
    if not log.caught_up(position + 1):
        return (
            f"{who}'s standby of {given.name} is {state.get('state')} at changelog offset {position}; "
            f"{given.changelog}-{given.tp.partition} ends at {log.end} (last stable {log.lso()})"
        )
    return None


async def standbys_warm(world: World) -> list[str]:
    """Wait until every standby given is warm; the problems of those still cold after :data:`WARM_LIMIT_S`."""
    deadline = world.loop.time() + WARM_LIMIT_S
    while True:
        cold = [why for given in _given(world) if (why := _cold(world, given)) is not None]
        if not cold:
            return _uncounted(world)
        if world.loop.time() > deadline:
            return [f"not warm {WARM_LIMIT_S:.0f}s after the run settled: {why}" for why in cold[:5]]
        await asyncio.sleep(0.5)


def _uncounted(world: World) -> list[str]:
    """Each running worker's ``pipeline_standby_records_total`` counts at least what its standbys say they
    replayed (the counter also counts standbys since closed): the metric an operator watches is told."""
    problems = []
    for slot in world.slots:
        worker = slot.worker if slot.running else None
        if worker is None:
            continue
        replayed = sum(int(str(state.get("replayed", 0))) for state in worker.standby_states().values())
        counted = worker.metrics.registry.get_sample_value("pipeline_standby_records_total") or 0.0
        if counted < replayed:
            problems.append(
                f"{slot.name}'s standbys replayed {replayed} changelog records, but "
                f"pipeline_standby_records_total says {counted:.0f}"
            )
    return problems
