"""The requests declared by hand in pipeline/kafka/requests.py: their wire shapes, the versions they need, their answers."""

from __future__ import annotations

from io import BytesIO

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IncompatibleBrokerVersion,
    UnknownTopicOrPartitionError,
)
from aiokafka.protocol.api import RequestHeader_v2

from pipeline.kafka import requests
from pipeline.kafka.requests import (
    UNSTABLE_OFFSET_COMMIT,
    GroupMetadata,
    MetadataRequest,
    OffsetFetchRequest,
    OffsetFetchResponseV7,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponseV3,
    read_offset_fetch,
)

#: the versions a Kafka 4.1 broker serves (ApiVersions): Metadata, OffsetFetch, TxnOffsetCommit
KAFKA_4 = {3: (0, 13), 9: (1, 9), 28: (0, 5)}
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_metadata_v12_is_a_flexible_request_naming_its_topics() -> None:
    """Metadata v12 encodes as a flexible request and decodes to the topics asked for."""
    struct = MetadataRequest(["a", "b"]).prepare(KAFKA_4)
    assert struct.API_VERSION == 12
    assert struct.FLEXIBLE_VERSION
    assert type(struct).decode(BytesIO(struct.encode())).topics[1][1] == "b"


def test_txn_offset_commit_v3_carries_the_group_metadata_and_each_offset() -> None:
    """TxnOffsetCommit v3: the generation, member id and group instance id beside the producer's id and epoch;
    each offset with no leader epoch and its metadata, grouped by topic, in order."""
    group = GroupMetadata("g", 7, "member-1", "instance-1")
    request = TxnOffsetCommitRequest("tx", 1000, 3, group, {B0: (9, None), A1: (5, ""), A0: (4, "m")})
    struct = request.prepare(KAFKA_4)
    assert (struct.API_KEY, struct.API_VERSION, struct.FLEXIBLE_VERSION) == (28, 3, True)
    assert isinstance(struct.build_request_header(1, "c"), RequestHeader_v2)  # tagged fields in the header
    decoded = type(struct).decode(BytesIO(struct.encode()))
    assert (decoded.transactional_id, decoded.group_id, decoded.producer_id, decoded.producer_epoch) == (
        "tx",
        "g",
        1000,
        3,
    )
    assert (decoded.generation_id, decoded.member_id, decoded.group_instance_id) == (
        7,
        "member-1",
        "instance-1",
    )
    assert decoded.topics == [
        ("a", [(0, 4, -1, "m", {}), (1, 5, -1, "", {})], {}),
        ("b", [(0, 9, -1, None, {})], {}),
    ]


def test_txn_offset_commit_v3_without_a_group_instance_id_sends_null() -> None:
    """A dynamic member (no group instance id) sends null, which the coordinator reads as "not static"."""
    struct = TxnOffsetCommitRequest("tx", 1, 0, GroupMetadata("g", 1, "m", None), {A0: (1, "")}).prepare(
        KAFKA_4
    )
    assert type(struct).decode(BytesIO(struct.encode())).group_instance_id is None


def test_txn_offset_commit_v3_response_decodes_per_partition_errors() -> None:
    """The v3 answer: each topic's partitions with their error codes."""
    response = TxnOffsetCommitResponseV3(0, [("a", [(0, 0, {}), (1, 22, {})], {})], {})
    decoded = TxnOffsetCommitResponseV3.decode(BytesIO(response.encode()))
    assert decoded.topics == [("a", [(0, 0, {}), (1, 22, {})], {})]


def test_offset_fetch_v7_asks_with_require_stable() -> None:
    """OffsetFetch v7 names each topic's partitions once, in order, and carries require_stable."""
    struct = OffsetFetchRequest("g", [B0, A1, A0, A1], require_stable=True).prepare(KAFKA_4)
    assert (struct.API_KEY, struct.API_VERSION, struct.FLEXIBLE_VERSION) == (9, 7, True)
    decoded = type(struct).decode(BytesIO(struct.encode()))
    assert decoded.group_id == "g"
    assert decoded.topics == [("a", [0, 1], {}), ("b", [0], {})]
    assert decoded.require_stable is True


@pytest.mark.parametrize(
    ("request_", "versions"),
    [
        (OffsetFetchRequest("g", [A0], require_stable=True), {9: (1, 6)}),
        (TxnOffsetCommitRequest("tx", 1, 0, GroupMetadata("g", 1, "m", None), {A0: (1, "")}), {28: (0, 2)}),
        (OffsetFetchRequest("g", [A0], require_stable=True), {}),
    ],
    ids=["offset-fetch-v6-broker", "txn-offset-commit-v2-broker", "no-versions-known"],
)
def test_a_broker_without_the_version_is_refused_by_name(
    request_: object, versions: dict[int, tuple[int, int]]
) -> None:
    """A broker that does not serve the version (Kafka before 2.5) gets a clear IncompatibleBrokerVersion."""
    with pytest.raises(IncompatibleBrokerVersion, match=r"v[37] \(it serves"):
        request_.prepare(versions)  # type: ignore[attr-defined]


def _fetch_answer(*partitions: tuple[str, int, int, int], error: int = 0) -> OffsetFetchResponseV7:
    """An OffsetFetch v7 answer: (topic, partition, offset, error code) rows."""
    topics: dict[str, list[tuple[int, int, int, str, int, dict[int, bytes]]]] = {}
    for topic, partition, offset, code in partitions:
        topics.setdefault(topic, []).append((partition, offset, -1, "", code, {}))
    response = OffsetFetchResponseV7(0, [(t, rows, {}) for t, rows in topics.items()], error, {})
    decoded: OffsetFetchResponseV7 = OffsetFetchResponseV7.decode(BytesIO(response.encode()))
    return decoded


def test_a_stable_answer_gives_offsets_and_none_for_nothing_committed() -> None:
    """Offsets as committed; -1 (nothing committed) as None; nothing to ask again."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, 12, 0), ("a", 1, -1, 0)), [A0, A1])
    assert answer.committed == {A0: 12, A1: None}
    assert answer.again == []
    assert not answer.coordinator_moved


def test_a_partition_a_pending_transaction_holds_is_asked_again() -> None:
    """UNSTABLE_OFFSET_COMMIT: the partition is asked again; the others are answered."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, -1, UNSTABLE_OFFSET_COMMIT), ("b", 0, 4, 0)), [A0, B0])
    assert answer.committed == {B0: 4}
    assert answer.again == [A0]


def test_a_coordinator_elsewhere_means_finding_it_again_and_asking_for_all() -> None:
    """A top-level NOT_COORDINATOR (16) asks again for every partition, after finding the coordinator again."""
    answer = read_offset_fetch(_fetch_answer(error=16), [A0, B0])
    assert answer.again == [A0, B0]
    assert answer.coordinator_moved
    assert read_offset_fetch(_fetch_answer(error=14), [A0]).again == [A0]  # loading: just again


def test_a_refusal_asking_again_would_not_change_is_raised() -> None:
    """GROUP_AUTHORIZATION_FAILED at the top, UNKNOWN_TOPIC_OR_PARTITION for a partition: raised."""
    with pytest.raises(GroupAuthorizationFailedError):
        read_offset_fetch(_fetch_answer(error=GroupAuthorizationFailedError.errno), [A0])
    with pytest.raises(UnknownTopicOrPartitionError):
        read_offset_fetch(_fetch_answer(("a", 0, -1, UnknownTopicOrPartitionError.errno)), [A0])


def test_the_group_fenced_codes_are_kafkas() -> None:
    """ILLEGAL_GENERATION 22, UNKNOWN_MEMBER_ID 25, FENCED_INSTANCE_ID 82 (Kafka's Errors)."""
    assert {22, 25, 82} == requests.GROUP_FENCED
