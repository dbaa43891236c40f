"""The broker model's group coordinator: the classic eager protocol, and the group's committed offsets.

Generations; JoinGroup held until every member has rejoined (or the rebalance timeout), SyncGroup
held until the leader's assignment, heartbeats and session expiry; static members (KIP-345: an
instance id replaces the member it names, and fences the old one); committed offsets, written only
when the transaction that carried them commits (the transaction coordinator, ``broker.py``, moves
them from ``pending_offsets``), and the check of a transaction's offsets against the generation.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.simulation.codes import (
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNSTABLE_OFFSET_COMMIT,
)

if TYPE_CHECKING:
    from tests.simulation.broker import Broker


@dataclass
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    protocol_type: str
    deadline: float = 0.0
    process: Any = None  # the simulated process behind it
    instance_id: str | None = None  # group.instance.id (static membership), from its JoinGroup
    join: asyncio.Future[Any] | None = None
    sync: asyncio.Future[Any] | None = None
    assignment: bytes = b""


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = "empty"  # empty, preparing, completing, stable
        self.generation = 0
        self.members: dict[str, Member] = {}
        self.pending_ids: set[str] = set()  # ids handed out with MEMBER_ID_REQUIRED
        self.leader: str | None = None
        self.protocol: str | None = None
        self.committed: dict[tuple[str, int], int] = {}
        self.pending_offsets: dict[int, dict[tuple[str, int], int]] = {}  # producer id -> offsets
        self.rebalance_deadline: float = 0.0
        self.stable_since: float = 0.0
        self.rebalance_timer: asyncio.TimerHandle | None = None


class GroupCoordinator:
    """The groups of the broker model, by id (see the module); its clock and timers are the broker's."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.groups: dict[str, Group] = {}
        self._members = itertools.count(1)

    def check_member(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """The group coordinator's check of a transaction's offsets (Kafka 4, a classic group): a request that
        names no member (v0, or v3 from a client outside the group) is taken; one that does is taken only
        from a member of the current generation, so a zombie's transaction cannot commit offsets."""
        group = self.groups.get(group_id)
        if group is None:
            return ILLEGAL_GENERATION if generation >= 0 else NONE
        if generation < 0 and not group.members:
            return NONE
        if generation < 0 and not member_id and instance_id is None:
            return NONE  # transactional offsets need no member: an old producer's v0
        if instance_id is not None:
            static = next((m for m in group.members.values() if m.instance_id == instance_id), None)
            if static is None:
                return UNKNOWN_MEMBER_ID
            if static.member_id != member_id:
                return FENCED_INSTANCE_ID
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        return ILLEGAL_GENERATION if generation != group.generation else NONE

    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return group

    def describe_group(self, group_id: str) -> tuple[str, str, str, list[Member]]:
        """``group_id``'s state as Kafka names it, protocol type, protocol and members (DescribeGroups)."""
        group = self.groups.get(group_id)
        if group is None:
            return "Dead", "", "", []
        state = {
            "empty": "Empty",
            "preparing": "PreparingRebalance",
            "completing": "CompletingRebalance",
            "stable": "Stable",
        }[group.state]
        members = list(group.members.values())
        protocol_type = members[0].protocol_type if members else "consumer"
        return state, protocol_type, group.protocol or "", members

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        process: Any,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> dict[str, Any]:
        group = self.group(group_id)
        if instance_id is not None:
            if member_id and self._fenced_static(group, member_id, instance_id):
                return {"error": FENCED_INSTANCE_ID, "member_id": member_id}
            if not member_id:  # KIP-345: a static member is given its id at once, no MEMBER_ID_REQUIRED
                member_id = f"{instance_id}-{next(self._members)}"
                group.pending_ids.add(member_id)
                self._replace_static(group, instance_id, member_id)
        if not member_id:
            member_id = f"{client_id}-{next(self._members)}"
            group.pending_ids.add(member_id)
            return {"error": MEMBER_ID_REQUIRED, "member_id": member_id}
        member = group.members.get(member_id)
        if member is None:
            if member_id not in group.pending_ids:
                return {"error": UNKNOWN_MEMBER_ID, "member_id": member_id}
            group.pending_ids.discard(member_id)
            member = group.members[member_id] = Member(
                member_id,
                client_id,
                session_timeout_ms / 1000,
                rebalance_timeout_ms / 1000,
                protocols,
                protocol_type,
            )
            self.broker.trace(f"broker: group {group_id}: {member_id} joins")
        member.protocols = protocols
        member.process = process
        member.instance_id = instance_id
        member.deadline = self.broker.now() + member.session_timeout_s
        self._expire_later(group, member)
        if member.join is not None and not member.join.done():
            member.join.set_result({"error": UNKNOWN_MEMBER_ID, "member_id": member_id})
        member.join = self.broker.loop.create_future()
        if group.state != "preparing":
            self._prepare(group, f"{member_id} joined")
        self._maybe_complete_join(group)
        return await member.join  # type: ignore[no-any-return]

    @staticmethod
    def _static(group: Group, instance_id: str) -> Member | None:
        return next((m for m in group.members.values() if m.instance_id == instance_id), None)

    def _fenced_static(self, group: Group, member_id: str, instance_id: str | None) -> bool:
        """KIP-345: a request naming ``instance_id`` from another member id than the one the group now knows
        it by (a newer member joined under it) is answered FENCED_INSTANCE_ID."""
        if instance_id is None:
            return False
        static = self._static(group, instance_id)
        return static is not None and static.member_id != member_id

    def _replace_static(self, group: Group, instance_id: str, member_id: str) -> None:
        """A static member joins under ``instance_id`` with no member id: the member the group knew by it is
        replaced (its pending JoinGroup or SyncGroup answered FENCED_INSTANCE_ID); the group rebalances (the
        coordinator may skip that when stable and the protocols are unchanged: the model always does it)."""
        old = self._static(group, instance_id)
        if old is None:
            return
        del group.members[old.member_id]
        for waiting in (old.join, old.sync):
            if waiting is not None and not waiting.done():
                waiting.set_result({"error": FENCED_INSTANCE_ID, "member_id": old.member_id})
        if group.leader == old.member_id:
            group.leader = None
        self.broker.trace(
            f"broker: group {group.group_id}: {member_id} replaces {old.member_id} (instance {instance_id})"
        )

    def _prepare(self, group: Group, why: str) -> None:
        group.state = "preparing"
        self.broker.trace(f"broker: group {group.group_id}: rebalance ({why})")
        for member in group.members.values():
            if member.sync is not None and not member.sync.done():
                member.sync.set_result({"error": REBALANCE_IN_PROGRESS})
        timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        group.rebalance_timer = self.broker.later(timeout, self._rebalance_timed_out, group, group.generation)

    def _rebalance_timed_out(self, group: Group, generation: int) -> None:
        if group.state != "preparing" or group.generation != generation:
            return
        for member_id, member in list(group.members.items()):
            if member.join is None or member.join.done():
                self.broker.trace(
                    f"broker: group {group.group_id}: {member_id} did not rejoin in time; removed"
                )
                del group.members[member_id]
        self._maybe_complete_join(group, force=True)

    def _maybe_complete_join(self, group: Group, *, force: bool = False) -> None:
        if group.state != "preparing":
            return
        waiting = [m for m in group.members.values() if m.join is not None and not m.join.done()]
        if not force and len(waiting) < len(group.members):
            return
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None
        group.generation += 1
        if not group.members:
            group.state = "empty"
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol = group.members[group.leader].protocols[0][0]
        group.state = "completing"
        self.broker.trace(
            f"broker: group {group.group_id}: generation {group.generation}, members {sorted(group.members)}"
        )
        members = [(m.member_id, dict(m.protocols).get(group.protocol, b"")) for m in group.members.values()]
        for member in group.members.values():
            member.deadline = self.broker.now() + member.session_timeout_s
            self._expire_later(group, member)
            if member.join is not None and not member.join.done():
                member.join.set_result(
                    {
                        "error": NONE,
                        "generation": group.generation,
                        "protocol": group.protocol,
                        "leader": group.leader,
                        "member_id": member.member_id,
                        "members": members if member.member_id == group.leader else [],
                    }
                )

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: list[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> dict[str, Any]:
        group = self.group(group_id)
        if self._fenced_static(group, member_id, instance_id):
            return {"error": FENCED_INSTANCE_ID}
        member = group.members.get(member_id)
        if member is None:
            return {"error": UNKNOWN_MEMBER_ID}
        if generation != group.generation:
            return {"error": ILLEGAL_GENERATION}
        if group.state == "preparing":
            return {"error": REBALANCE_IN_PROGRESS}
        member.deadline = self.broker.now() + member.session_timeout_s
        if group.state == "stable":
            return {"error": NONE, "assignment": member.assignment}
        if member_id == group.leader:
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = "stable"
            group.stable_since = self.broker.now()
            self.broker.trace(f"broker: group {group.group_id}: generation {group.generation} stable")
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result({"error": NONE, "assignment": m.assignment})
            return {"error": NONE, "assignment": member.assignment}
        if member.sync is not None and not member.sync.done():
            member.sync.set_result({"error": REBALANCE_IN_PROGRESS})
        member.sync = self.broker.loop.create_future()
        return await member.sync  # type: ignore[no-any-return]

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> int:
        group = self.group(group_id)
        if self._fenced_static(group, member_id, instance_id):
            return FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        member.deadline = self.broker.now() + member.session_timeout_s
        self._expire_later(group, member)
        if group.state == "preparing":
            return REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return ILLEGAL_GENERATION
        return NONE

    def leave(self, group_id: str, member_id: str) -> int:
        group = self.group(group_id)
        if group.members.pop(member_id, None) is None:
            return UNKNOWN_MEMBER_ID
        self.broker.trace(f"broker: group {group_id}: {member_id} leaves")
        self._after_removal(group, f"{member_id} left")
        return NONE

    def _expire_later(self, group: Group, member: Member) -> None:
        self.broker.later(member.session_timeout_s + 0.001, self._expire, group, member)

    def _expire(self, group: Group, member: Member) -> None:
        if group.members.get(member.member_id) is not member or self.broker.now() < member.deadline:
            return
        if self.broker.down:
            return
        if group.state == "preparing" and member.join is not None and not member.join.done():
            return  # waiting in JoinGroup: kept until the rebalance ends
        del group.members[member.member_id]
        self.broker.trace(f"broker: group {group.group_id}: {member.member_id} session expired")
        self._after_removal(group, f"{member.member_id} expired")

    def _after_removal(self, group: Group, why: str) -> None:
        if group.state == "preparing":
            self._maybe_complete_join(group)
        elif group.members:
            self._prepare(group, why)
        else:
            group.state = "empty"
            group.generation += 1

    def restarted(self) -> None:
        """Back after an outage: sessions count from now (Kafka reloads the group with fresh deadlines)."""
        for group in self.groups.values():
            for member in group.members.values():
                member.deadline = self.broker.now() + member.session_timeout_s
                self._expire_later(group, member)
            if group.state == "preparing":
                if group.rebalance_timer is not None:
                    group.rebalance_timer.cancel()
                timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
                group.rebalance_timer = self.broker.later(
                    timeout, self._rebalance_timed_out, group, group.generation
                )
            for member in group.members.values():  # requests held in JoinGroup and SyncGroup were lost
                member.join = None
                member.sync = None

    def offset_fetch(
        self, group_id: str, tps: list[tuple[str, int]], *, require_stable: bool = False
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Each partition's (committed offset or -1, error). With ``require_stable`` (OffsetFetch v7+), a
        partition a pending transaction holds offsets of (its TxnOffsetCommit taken, its markers not yet
        written) is UNSTABLE_OFFSET_COMMIT, so a new owner waits for that transaction instead of starting
        from the offset before it."""
        group = self.group(group_id)
        held = (
            {tp for offsets in group.pending_offsets.values() for tp in offsets} if require_stable else set()
        )
        return {
            tp: (-1, UNSTABLE_OFFSET_COMMIT) if tp in held else (group.committed.get(tp, -1), NONE)
            for tp in tps
        }
