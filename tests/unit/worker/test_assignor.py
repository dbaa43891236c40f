"""The assignor's side of the group protocol: what members claim, what the leader hands out, and older workers."""

from __future__ import annotations

import logging

import pytest
from aiokafka import TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocol

from pipeline.worker.assignment import Claim
from pipeline.worker.assignor import Held, StandbyAssignor, decode_claim, decode_standbys, encode_standbys

TOPIC = "raw"


class Cluster:
    """The one call the assignor makes on aiokafka's cluster metadata."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.partitions.get(topic)
        return set(range(count)) if count is not None else None


def _assignor(positions: dict[TopicPartition, int] | None = None, replicas: int = 1) -> StandbyAssignor:
    held = Held(positions or {}, frozenset((positions or {}).keys()))
    return StandbyAssignor(replicas=replicas, held=lambda: held)


def _metadata(assignor: StandbyAssignor) -> ConsumerProtocol.METADATA:
    """The metadata as the leader receives it: encoded by one member, decoded by aiokafka."""
    return ConsumerProtocol.METADATA.decode(assignor.metadata([TOPIC]).encode())


def test_the_metadata_claims_every_store_and_the_partitions_served() -> None:
    """What a member holds travels in its JoinGroup metadata and comes back out whole."""
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    held = Held({tp0: 41, tp1: -1}, frozenset({tp0}))
    meta = ConsumerProtocol.METADATA.decode(
        StandbyAssignor(replicas=1, held=lambda: held).metadata([TOPIC]).encode()
    )
    claim = decode_claim(meta.subscription, meta.user_data)
    assert claim.positions == {tp0: 41, tp1: -1}
    assert claim.active == {tp0}
    assert claim.standby_capable
    assert meta.subscription == [TOPIC]


def test_the_protocol_keeps_the_name_older_workers_offer() -> None:
    """A worker from before standbys offers aiokafka's roundrobin: the same name, so one group can hold both."""
    assert StandbyAssignor.name == RoundRobinPartitionAssignor.name


def test_an_older_member_is_given_work_it_can_read_and_no_standby() -> None:
    """A leader with standbys plans for a roundrobin member: it gets its share, decodable by aiokafka, and no standby."""
    leader = _assignor()
    old = ConsumerProtocol.METADATA.decode(RoundRobinPartitionAssignor.metadata([TOPIC]).encode())
    members = {"new": _metadata(leader), "old": old, "new2": _metadata(_assignor())}
    given = leader.assign(Cluster({TOPIC: 6}), members)
    decoded = {m: ConsumerProtocol.ASSIGNMENT.decode(a.encode()) for m, a in given.items()}
    assert sorted(tp for a in decoded.values() for tp in a.partitions()) == [
        TopicPartition(TOPIC, p) for p in range(6)
    ]
    assert len(decoded["old"].partitions()) == 2
    assert decode_standbys(decoded["old"].user_data) == []
    assert decode_standbys(decoded["new"].user_data)  # the new members keep the standbys


def test_an_older_leader_assigns_round_robin_and_nobody_holds_a_standby() -> None:
    """When a roundrobin worker leads, the new members' metadata is read by aiokafka and their assignments carry no standby."""
    members = {"new": _metadata(_assignor()), "new2": _metadata(_assignor())}
    given = RoundRobinPartitionAssignor.assign(Cluster({TOPIC: 4}), members)
    follower = _assignor()
    follower.on_assignment(ConsumerProtocol.ASSIGNMENT.decode(given["new"].encode()))
    assert follower.standbys == frozenset()
    assert len(given["new"].partitions()) == 2


def test_each_member_learns_its_standbys_from_its_assignment() -> None:
    """on_assignment keeps the standby partitions of the assignment, never one it serves."""
    leader = _assignor()
    members = {"a": _metadata(leader), "b": _metadata(_assignor())}
    given = leader.assign(Cluster({TOPIC: 4}), members)
    for member, assignment in given.items():
        follower = _assignor()
        follower.on_assignment(ConsumerProtocol.ASSIGNMENT.decode(assignment.encode()))
        assert len(follower.standbys) == 2
        assert not follower.standbys & set(assignment.partitions()), member


def test_garbage_in_the_user_data_claims_nothing_and_raises_nothing() -> None:
    """Metadata or assignments with user data the assignor did not write are read as holding nothing."""
    for data in (
        b"",
        None,
        b"\x00\x01junk",
        b"webhook-pipeline/standby\x00{not json",
        b"webhook-pipeline/standby\x00[1]",
    ):
        assert not decode_claim([TOPIC], data).standby_capable
        assert decode_standbys(data) == []
    broken = b"webhook-pipeline/standby\x00" + b'{"v":1,"p":[["raw","x",3]]}'
    assert not decode_claim([TOPIC], broken).standby_capable
    assert decode_standbys(encode_standbys([TopicPartition(TOPIC, 3)])) == [TopicPartition(TOPIC, 3)]


def test_the_most_current_member_is_given_the_partition() -> None:
    """Through the real encodings: the member whose store is furthest along the changelog gets the partition."""
    tp = TopicPartition(TOPIC, 0)
    members = {
        "behind": _metadata(_assignor({tp: 10})),
        "ahead": _metadata(_assignor({tp: 500})),
        "empty": _metadata(_assignor()),
    }
    given = _assignor().assign(Cluster({TOPIC: 1}), members)
    assert given["ahead"].partitions() == [tp]
    assert decode_standbys(given["behind"].user_data) == [tp]


def test_a_leader_without_a_topics_partitions_reports_it_unplanned() -> None:
    """A subscribed topic missing from the leader's metadata is assigned to nobody and reported, once per plan."""
    reported: list[frozenset[str]] = []
    held = Held({}, frozenset())
    leader = StandbyAssignor(replicas=0, held=lambda: held, unplanned=reported.append)
    given = leader.assign(Cluster({}), {"a": _metadata(leader), "b": _metadata(_assignor())})
    assert all(not assignment.partitions() for assignment in given.values())
    assert reported == [frozenset({TOPIC})]


def test_a_leader_with_every_topics_partitions_reports_nothing() -> None:
    """With the metadata complete, nothing is reported and every partition has an owner."""
    reported: list[frozenset[str]] = []
    held = Held({}, frozenset())
    leader = StandbyAssignor(replicas=0, held=lambda: held, unplanned=reported.append)
    given = leader.assign(Cluster({TOPIC: 4}), {"a": _metadata(leader), "b": _metadata(_assignor())})
    assert sorted(p for a in given.values() for _t, ps in a.assignment for p in ps) == [0, 1, 2, 3]
    assert reported == []


def test_a_member_without_standbys_gets_an_assignment_without_user_data() -> None:
    """Only a member given standbys finds this assignor's data in its assignment; the others get empty user data."""
    leader = _assignor(replicas=0)
    given = leader.assign(Cluster({TOPIC: 2}), {"a": _metadata(leader), "b": _metadata(_assignor())})
    assert [a.user_data for a in given.values()] == [b"", b""]
    with_standbys = _assignor(replicas=1).assign(Cluster({TOPIC: 2}), {"a": _metadata(leader)})
    assert with_standbys["a"].user_data == b""  # alone: nobody to keep a standby of its partitions


def test_metadata_without_this_assignors_data_claims_only_the_subscription() -> None:
    """An older worker's metadata, or data that cannot be read, is a claim of the subscription alone, no standbys."""
    broken = b"webhook-pipeline/standby\x00" + b'{"v":1,"a":[["raw",null]]}'
    for data in (b"", broken):
        assert decode_claim([TOPIC], data) == Claim(frozenset({TOPIC}), standby_capable=False)


def test_a_claim_may_leave_out_its_positions_or_the_partitions_it_served() -> None:
    """This assignor's data without ``p`` claims no store, without ``a`` no partition served: still a standby member."""
    magic = b"webhook-pipeline/standby\x00"
    tp = TopicPartition(TOPIC, 1)
    assert decode_claim([TOPIC], magic + b'{"v":1}') == Claim(frozenset({TOPIC}))
    assert decode_claim([TOPIC], magic + b'{"v":1,"a":[["raw",1]]}') == Claim(
        frozenset({TOPIC}), active=frozenset({tp})
    )
    assert decode_claim([TOPIC], magic + b'{"v":1,"p":[["raw",1,7]]}') == Claim(frozenset({TOPIC}), {tp: 7})
    assert decode_standbys(magic + b'{"v":1}') == []


def test_the_leader_logs_every_members_share(caplog: pytest.LogCaptureFixture) -> None:
    """The leader's log line names each member's partitions and standbys, "-" for none."""
    leader = _assignor()
    with caplog.at_level(logging.INFO, logger="pipeline.worker.assignor"):
        leader.assign(Cluster({TOPIC: 3}), {"a": _metadata(leader), "b": _metadata(_assignor())})
    assert caplog.messages == [
        "assignment (this worker leads the group): a: raw-0,raw-2 (standby raw-1); b: raw-1 (standby raw-0,raw-2)"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.worker.assignor"):
        _assignor(replicas=0).assign(Cluster({TOPIC: 1}), {"a": _metadata(leader), "b": _metadata(leader)})
    assert caplog.messages == [
        "assignment (this worker leads the group): a: raw-0 (standby -); b: - (standby -)"
    ]
