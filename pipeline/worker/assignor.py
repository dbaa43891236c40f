"""The worker's partition assignor: its side of the group protocol, which carries standbys.

aiokafka calls an assignor's :meth:`~StandbyAssignor.metadata` when it joins the
group, :meth:`~StandbyAssignor.assign` on the member the broker elected leader,
and :meth:`~StandbyAssignor.on_assignment` on every member before the
rebalance listener hears of its new partitions.

- The member metadata's ``user_data`` carries what this worker holds: the
  changelog position of every store it has (served, standby, or on its disk)
  and the partitions it served in the last generation.
- The leader plans with :func:`pipeline.worker.assignment.plan` and writes each
  member's standby partitions into its assignment's ``user_data``; the active
  partitions travel as in any consumer assignment.
- A subscribed topic the leader's metadata has no partitions of is reported
  (``unplanned``): :class:`~pipeline.worker.metadata_refresh.MetadataRefresh`
  then asks for the metadata and a new rebalance.

The protocol keeps the name ``roundrobin``, which workers from before standbys
offer (aiokafka's default assignor). Kafka picks a protocol every member offers,
so a group of old and new workers (a rolling upgrade) agrees on this one: when an
old worker leads, it assigns round-robin and nobody holds a standby; when a new one
leads, an old member's metadata has no standby data, so it is given its share of
partitions and no standby, and it ignores the ``user_data`` of its assignment.
Offering two protocols instead does not work with aiokafka 0.14: it sends one
JoinGroup per assignor it is given, the first with that assignor alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import orjson
from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from pipeline.worker.assignment import Claim, plan

log = logging.getLogger(__name__)

MAGIC = b"webhook-pipeline/standby\x00"  # leads every user_data this assignor writes
DATA_VERSION = 1


class Held(NamedTuple):
    """What this worker holds, for its JoinGroup metadata."""

    positions: Mapping[TopicPartition, int]  # the changelog offset of every store it has
    served: frozenset[TopicPartition]  # the partitions it served in the last generation


class StandbyAssignor:
    """An aiokafka partition assignor (``partition_assignment_strategy``) with standby replicas."""

    name = "roundrobin"  # what workers before standbys offer: see the module
    version = 0

    def __init__(
        self,
        *,
        replicas: int,
        held: Callable[[], Held],
        unplanned: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self.replicas = replicas  # standbys per partition, when this worker leads
        self._held = held
        self._unplanned = unplanned  # told the subscribed topics this worker led without the partitions of
        self.standbys: frozenset[TopicPartition] = frozenset()  # this member's, from its last assignment

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """The JoinGroup metadata: the subscription, and what this worker holds."""
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), encode_claim(self._held()))

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """The leader's plan for every member (aiokafka's ``ClusterMetadata`` gives the partitions)."""
        claims = {member: decode_claim(meta.subscription, meta.user_data) for member, meta in members.items()}
        topics = sorted({topic for claim in claims.values() for topic in claim.subscription})
        known = {topic: sorted(cluster.partitions_for_topic(topic) or ()) for topic in topics}
        partitions = [TopicPartition(topic, partition) for topic in topics for partition in known[topic]]
        plans = plan(partitions, claims, replicas=self.replicas)
        unplanned = frozenset(topic for topic, numbers in known.items() if not numbers)
        if unplanned and self._unplanned is not None:
            # this worker's metadata lacks them (an update failed or answered an error): nobody gets
            # their partitions until a rebalance led with fresh metadata (``unplanned`` asks for one)
            self._unplanned(unplanned)
        log.info(
            "assignment (this worker leads the group): %s",
            "; ".join(
                f"{member}: {_names(p.active)} (standby {_names(p.standby)})" for member, p in plans.items()
            ),
        )
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version, _by_topic(p.active), encode_standbys(p.standby) if p.standby else b""
            )
            for member, p in plans.items()
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Remember this member's standby partitions (before the rebalance listener runs)."""
        self.standbys = frozenset(decode_standbys(assignment.user_data)) - set(assignment.partitions())


def encode_claim(held: Held) -> bytes:
    """The metadata's user_data: positions and the partitions served."""
    body = {
        "v": DATA_VERSION,
        "p": sorted([tp.topic, tp.partition, offset] for tp, offset in held.positions.items()),
        "a": sorted([tp.topic, tp.partition] for tp in held.served),
    }
    return MAGIC + orjson.dumps(body)


def decode_claim(subscription: Iterable[str], data: bytes | None) -> Claim:
    """A member's claim; metadata without this assignor's data (an older worker, another client) claims
    nothing and gets no standby. Never raises: a member that sent garbage still gets work."""
    topics = frozenset(subscription)
    body = _body(data)
    if body is None:
        return Claim(topics, standby_capable=False)
    try:
        positions = {TopicPartition(str(t), int(p)): int(o) for t, p, o in body.get("p", [])}
        served = frozenset(TopicPartition(str(t), int(p)) for t, p in body.get("a", []))
    except (TypeError, ValueError):
        return Claim(topics, standby_capable=False)
    return Claim(topics, positions, served)


def encode_standbys(standbys: Iterable[TopicPartition]) -> bytes:
    """An assignment's user_data: the member's standby partitions."""
    return MAGIC + orjson.dumps({"v": DATA_VERSION, "s": sorted([tp.topic, tp.partition] for tp in standbys)})


def decode_standbys(data: bytes | None) -> list[TopicPartition]:
    """The standby partitions in an assignment's user_data (none when it has no such data)."""
    body = _body(data)
    if body is None:
        return []
    try:
        return [TopicPartition(str(t), int(p)) for t, p in body.get("s", [])]
    except (TypeError, ValueError):
        return []


def _body(data: bytes | None) -> dict[str, Any] | None:
    if not data or not data.startswith(MAGIC):
        return None
    try:
        body = orjson.loads(data[len(MAGIC) :])
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) and body.get("v") == DATA_VERSION else None


def _by_topic(partitions: Iterable[TopicPartition]) -> list[tuple[str, list[int]]]:
    grouped: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return sorted(grouped.items())


def _names(partitions: Iterable[TopicPartition]) -> str:
    return ",".join(f"{tp.topic}-{tp.partition}" for tp in sorted(partitions)) or "-"
