"""A seed's faults, each at its moment: what the broker, the network, the disks and the workers suffer.

The scenario draws the faults (``tests/simulation/faults.py``: kind, time, target, duration); the
:class:`Injector` waits for each one's moment on the world's clock and applies it: to the broker
model (an outage, a fenced or refused producer, a lost commit, a rebalance storm, a topic's limits),
to a worker's process through the fleet (a SIGKILL, a SIGSTOP, a rolling restart, a twin, a foreign
store planted in its state dir, the group's leader killed as it plans), or as the operator's work
(``operators.py``: a fix, a ``dlq replay``, the console's redrive, a rescale, a downtime, a clock jump).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocol

from pipeline.errors import StoreLockedError
from pipeline.state import directory
from pipeline.state.store import bucket_width
from pipeline.state.store_meta import StoreIdentity
from tests.simulation import broker as b
from tests.simulation import codes, handlers, redrive, timeline
from tests.simulation import faults as fault_module
from tests.simulation.faults import RECONFIGURE, RESCALE, REVOKE_MID_OPEN, Fault, SimStore
from tests.simulation.loop import Process
from tests.simulation.scenario import APP, GROUP

if TYPE_CHECKING:
    from tests.simulation.fleet import Slot
    from tests.simulation.world import World


class Injector:
    """Applies the scenario's faults at their times (see the module)."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def run(self) -> None:
        """Each fault of the scenario at its time, each in a task of its own; ends when every one has."""
        pending: list[asyncio.Task[Any]] = []
        for fault in self.world.scenario.faults:
            wait = fault.at - self.world.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.world.note(f"FAULT {fault.describe()}")
            pending.append(self.world.loop.spawn(None, self._apply(fault), f"fault-{fault.kind}"))
        for task in pending:
            await task

    async def _apply(self, fault: Fault) -> None:
        kind = fault.kind
        operators = self.world.operators
        if kind == redrive.FIX:
            await operators.fix()
            return
        if kind == redrive.REPLAY:
            await operators.replays(fault)
            return
        if kind == redrive.CONSOLE:
            await operators.consoles.redrives(fault, operators.cut)
            return
        if kind == RESCALE:
            await operators.rescale(fault)
            return
        if kind == RECONFIGURE:
            operators.reconfigure(fault)
            return
        if kind == timeline.DOWNTIME:
            await operators.downtime(fault)
            return
        if kind == timeline.CLOCK_JUMP:
            if fault.target < len(self.world.slots):
                await operators.clock_jump(self.world.slots[fault.target], fault)
            return
        if kind == "join":
            self.world.fleet.add()
            return
        if kind == "outage":
            await self.world.outage(fault.duration)
            return
        if kind == "fence":
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None and txn_id in self.world.broker.transactions.txns:
                while (
                    self.world.broker.transactions.init_producer_id(txn_id, 60_000)[0]
                    == codes.CONCURRENT_TRANSACTIONS
                ):
                    await asyncio.sleep(0.05)
            return
        if kind == fault_module.STORM:
            self.world.broker.storm_until = self.world.loop.time() + fault.duration
            return
        if kind == fault_module.CORRUPT:
            txn_id = await self._bisecting() if fault.detail == "bisecting" else None
            txn_id = txn_id or self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.world.broker.inject(kind, "produce", txn_id)
            return
        if kind == fault_module.REFUSE_REPLAY:
            self.world.broker.inject(kind, b.PLAIN_PRODUCE, "")  # no transactional id: any plain producer's
            self.world.note("the broker will refuse the next produce request of a dlq replay as corrupt")
            return
        if kind == fault_module.LOST_COMMIT:
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.world.broker.inject(kind, "end-txn-lost", txn_id)
            return
        if kind in ("producer-fatal", "commit-refused"):
            txn_id = self._txn_of_partition(fault.target)
            if txn_id is not None:
                self.world.broker.inject(kind, fault.detail, txn_id)
            return
        if kind == "refuse-outputs":
            topics = self.world.topology.topics
            if fault.detail == "timestamps":
                for name in (
                    topics.audit,
                    topics.dlq,
                    topics.changelog,
                    *self.world.topology.command_topics(),
                ):
                    self.world.broker.topics[name].config.timestamp_after_max_ms = 3_600_000
                # tighter on the DLQ topic: the DLQ record of a record dated ahead is refused (handlers.AHEAD_MS)
                self.world.broker.topics[topics.dlq].config.timestamp_after_max_ms = handlers.dlq_after_ms(
                    self.world.scenario.time
                )
            else:
                self.world.broker.topics[topics.commands].config.max_message_bytes = 700
                self.world.broker.topics[topics.commands].reconfigured = True
            return
        if kind == "leader-kill":
            await self._kill_leader_mid_rebalance(fault)
            return
        if fault.target >= len(self.world.slots):
            return
        slot = self.world.slots[fault.target]
        if kind == "promote-mid-replay":
            await self._promote_mid_replay(slot, fault)
            return
        if kind == REVOKE_MID_OPEN:
            await self._revoke_mid_open(slot, fault)
            return
        if kind == fault_module.TWIN:
            await self.world.fleet.twin(slot, fault)
            return
        process = slot.process
        if kind == "disk":
            self.world.disk.arm(slot.name, fault.detail, fault.steps)
            return
        if process is None or not process.alive:
            return
        if kind == "crash":
            self.world.fleet.crash_after(process, fault.steps)
            await asyncio.sleep(1.0)
            self.world.fleet.crash(process)
            await self.world.fleet.restart_later(slot, process, fault.duration)
        elif kind == "pause":
            self.world.loop.pause(process)
            self.world.note(f"{process.name} SIGSTOP")
            await asyncio.sleep(fault.duration)
            self.world.loop.resume(process)
            self.world.note(f"{process.name} SIGCONT")
        elif kind == "leave":
            await self.world.fleet.leave(slot, process, fault.duration)
        elif kind == "foreign-store":
            self.world.fleet.crash(process)
            self._plant_foreign_store(slot, fault.detail)
            await self.world.fleet.restart_later(slot, process, fault.duration)

    async def _kill_leader_mid_rebalance(self, fault: Fault) -> None:
        """A worker joins (a rebalance); the group's leader is SIGKILLed once JoinGroup has answered and
        before its SyncGroup has (while it makes the assignment), and started again later."""
        self.world.fleet.add()
        group = self.world.broker.group(GROUP)
        deadline = self.world.loop.time() + 30.0
        while self.world.loop.time() < deadline:
            leader = group.members.get(group.leader or "")
            if group.state == "completing" and leader is not None and leader.process is not None:
                victim = next((s for s in self.world.slots if s.process is leader.process), None)
                if victim is not None and victim.process is not None and victim.process.alive:
                    self.world.note(
                        f"{victim.process.name} is the group's leader, planning generation {group.generation}"
                    )
                    process = victim.process
                    self.world.fleet.crash(process)
                    await self.world.fleet.restart_later(victim, process, fault.duration)
                    return
            await asyncio.sleep(0.0005)
        self.world.note("leader-kill: no rebalance to kill the leader in")

    async def _promote_mid_replay(self, slot: Slot, fault: Fault) -> None:
        """The slot's standby requests crawl (0.5-3 s each) from now to 15 s past the fault's duration; once a
        round of one of its standbys is in flight (behind, if records came), the owner of that partition leaves
        (SIGTERM, started again 2 s later), so that the rebalance promotes the standby mid-round."""
        process, worker = slot.process, slot.worker
        if process is None or not process.alive or worker is None:
            return
        self.world.network.slow_standbys[slot.name] = (
            self.world.loop.time() + fault.duration + 15.0,
            (0.5, 3.0),
        )
        await asyncio.sleep(1.0)
        held = sorted(worker.standby_partitions()) if slot.worker is worker else []
        if not held:
            self.world.note(f"promote-mid-replay: {slot.name} keeps no standby")
            return
        tp = held[0]
        name = f"{tp.topic}-{tp.partition}"
        deadline = self.world.loop.time() + fault.duration
        while self.world.loop.time() < deadline and slot.worker is worker and slot.running:
            standby = worker.health()[1].get("standby", {}).get(name, {})
            behind = standby.get("lag_records") or self.world.loop.time() > deadline - fault.duration / 2
            if standby.get("replaying") and behind:
                break  # a round (with records to replay, if any came) waits on a crawling request
            await asyncio.sleep(0.01)
        owner_process = self._owner_of(f"{APP}-{GROUP}-{tp.topic}-{tp.partition}")
        owner = next(
            (s for s in self.world.slots if s.process is not None and s.process is owner_process), None
        )
        if owner is None or owner is slot or owner.worker is None or owner_process is None:
            self.world.note(f"promote-mid-replay: no owner of {tp.topic}-{tp.partition} to take it from")
            return
        self.world.note(
            f"promote-mid-replay: {owner_process.name} leaves {tp.topic}-{tp.partition} to {slot.name}'s standby"
        )
        await self.world.fleet.leave(owner, owner_process, 2.0)

    async def _revoke_mid_open(self, slot: Slot, fault: Fault) -> None:
        """The slot's changelog reads crawl (0.5-3 s each) from now to ``fault.duration`` past the next minute; its
        worker restarts (SIGTERM, started again half a second after it stopped; the crawl slows its start too),
        and once one of its partitions is opening or restoring, within a minute, a worker joins: the rebalance
        revokes partitions while they open."""
        process = slot.process
        if process is None or not process.alive or slot.worker is None:
            return
        self.world.network.slow_standbys[slot.name] = (
            self.world.loop.time() + 60.0 + fault.duration,
            (0.5, 3.0),
        )
        await self.world.fleet.leave(slot, process, 0.5)
        deadline = self.world.loop.time() + 60.0
        while self.world.loop.time() < deadline:
            worker, now = slot.worker, slot.process
            if worker is not None and now is not None and now.alive:
                states = worker.health()[1].get("partitions", {})
                opening = sorted(name for name, state in states.items() if state in ("opening", "restoring"))
                if opening:
                    self.world.note(f"revoke-mid-open: {now.name} opens {', '.join(opening)}; a worker joins")
                    self.world.fleet.add()
                    return
            await asyncio.sleep(0.001)
        self.world.note(f"revoke-mid-open: {slot.name} opened nothing within a minute")

    def _plant_foreign_store(self, slot: Slot, how: str) -> None:
        """Put, where one of ``slot``'s stores lives, a store under the same names but from elsewhere:
        another cluster's (claiming keys this workload sends) or one ahead of the changelog."""
        topics = self.world.topology.topics
        partition = self.world.rng.randrange(self.world.scenario.partitions)
        tp = TopicPartition(topics.input, partition)
        path = directory.store_path(slot.state_dir, self.world.topology, GROUP, tp)
        shutil.rmtree(path, ignore_errors=True)
        changelog_topic = self.world.broker.topics[topics.changelog]
        if how == "ahead":  # this cluster's changelog, but a position it never reached
            ids = (self.world.broker.cluster_id, str(changelog_topic.id))
        else:  # another cluster's store under the same names
            ids = (
                f"other-{self.world.rng.getrandbits(32):08x}",
                str(uuid.UUID(int=self.world.rng.getrandbits(128))),
            )
        identity = StoreIdentity(APP, GROUP, topics.input, partition, topics.changelog, *ids)
        bucket_ms = bucket_width(int(self.world.topology.max_ttl.total_seconds() * 1000))
        try:
            store = SimStore.open(path, bucket_ms=bucket_ms, identity=identity)
        except (
            StoreLockedError
        ):  # a store of this slot is still open (a standby closing): nothing to plant on
            self.world.note(f"foreign-store: {tp.topic}-{tp.partition} of {slot.name} is held; not planted")
            return
        try:
            from pipeline.state.decision import Entry  # noqa: PLC0415
            from pipeline.state.store import Change  # noqa: PLC0415

            now = int(self.world.loop.wall() * 1000)
            keys = [
                d.event_key
                for d in self.world.scenario.workload.deliveries
                if d.partition == partition and not d.poison
            ]
            changes = {}
            for key in keys[: max(1, len(keys) // 2)]:
                entry = Entry(
                    now, now + 7 * 86_400_000, partition, 0, 0, now, "handle", topics.commands, None, 0
                )
                changes[key.encode()] = Change.of(entry)
            changelog = self.world.broker.log(topics.changelog, partition)
            end = changelog.end if changelog is not None else 0
            offset = end + 1000 if how == "ahead" else max(end - 1, 0)
            store.write(changes, changelog_offset=offset, stream_time=now)
        finally:
            store.close()
        if how != "ahead":
            self.world.foreign_stores.add((slot.index, tp))
        self.world.note(f"planted a foreign store ({how}) for {tp.topic}-{tp.partition} in {slot.name}")

    def _txn_of_partition(self, partition: int) -> str | None:
        """The transactional id of the worker the stable group assigns input ``partition`` to (None: none now)."""
        owner = self._owner_of(f"{APP}-{GROUP}-{self.world.topology.topics.input}-{partition}")
        slot = next((s for s in self.world.slots if s.process is not None and s.process is owner), None)
        if slot is None or slot.worker is None:
            self.world.note(f"no worker serves partition {partition} now: the fault has no producer to hit")
            return None
        return slot.worker.transactional_id

    async def _bisecting(self, wait: float = 15.0) -> str | None:
        """The transactional id of a worker bisecting a partition's refused records, once one does (within
        ``wait`` seconds; None if none did): a one-off refusal aimed at a record being judged alone."""
        deadline = self.world.loop.time() + wait
        while self.world.loop.time() < deadline:
            for slot in self.world.slots:
                worker = slot.worker if slot.running else None
                if worker is not None and any(t.poison.limit is not None for t in worker.tasks.values()):
                    self.world.note(f"{slot.name} is bisecting: the corrupt fault aims at its producer")
                    return worker.transactional_id
            await asyncio.sleep(0.05)
        return None

    def _owner_of(self, txn_id: str) -> Process | None:
        """The process the stable group assigns ``txn_id``'s partition to (None while it rebalances)."""
        group = self.world.broker.group(GROUP)
        if group.state != "stable":
            return None
        topic, _, partition = txn_id.removeprefix(f"{APP}-{GROUP}-").rpartition("-")
        for member in group.members.values():
            if not member.assignment:
                continue
            assigned = ConsumerProtocol.ASSIGNMENT.decode(member.assignment).partitions()
            if TopicPartition(topic, int(partition)) in assigned:
                return member.process  # type: ignore[no-any-return]
        return None
