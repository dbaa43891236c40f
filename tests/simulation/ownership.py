"""Every partition is served only where the group assigns it.

Once a generation has been stable a moment, no member serves a partition the group gave another:
a worker that kept one through a rebalance would handle its records beside their owner. The check
runs beside the workers for the whole run and adds a problem for each such partition.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiokafka.coordinator.protocol import ConsumerProtocol

from tests.simulation.scenario import GROUP

if TYPE_CHECKING:
    from tests.simulation.world import World


async def watch_ownership(world: World) -> None:
    """Check each stable generation's members against what they serve, until the run ends."""
    while True:  # every quarter second while a worker runs (and every 5 s through a downtime of hours)
        await asyncio.sleep(0.25 if any(slot.running for slot in world.slots) else 5.0)
        group = world.broker.group(GROUP)
        if group.state != "stable" or world.loop.time() - group.stable_since < 1.0:
            continue
        for member in group.members.values():
            slot = next((s for s in world.slots if s.process is member.process and s.running), None)
            if slot is None or slot.worker is None or not member.assignment:
                continue
            assigned = set(ConsumerProtocol.ASSIGNMENT.decode(member.assignment).partitions())
            for tp, task in slot.worker.tasks.items():
                if task.serving and tp not in assigned:
                    problem = (
                        f"{member.process.name} serves {tp.topic}-{tp.partition}, which generation "
                        f"{group.generation} does not assign it"
                    )
                    if problem not in world.problems:
                        world.problems.append(problem)
