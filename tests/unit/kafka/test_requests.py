"""The requests declared by hand in pipeline/kafka/requests.py: their wire shapes, the versions they need, their answers."""

from __future__ import annotations

import uuid
from io import BytesIO
from struct import pack

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
    MetadataResponseV12,
    OffsetFetchRequest,
    OffsetFetchRequestV7,
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


# -- the wire, byte for byte, as Kafka's message schemas (clients/src/main/resources/common/message) lay it out


def _uvarint(value: int) -> bytes:
    """Kafka's unsigned varint: seven bits a byte, the low ones first."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _text(value: str | None) -> bytes:
    """A COMPACT_(NULLABLE_)STRING: length + 1 as a varint (0 for null), then UTF-8."""
    return b"\x00" if value is None else _uvarint(len(value.encode()) + 1) + value.encode()


def _array(*items: bytes) -> bytes:
    """A COMPACT_ARRAY: count + 1 as a varint, then the items."""
    return _uvarint(len(items) + 1) + b"".join(items)


def _i16(value: int) -> bytes:
    return pack(">h", value)


def _i32(value: int) -> bytes:
    return pack(">i", value)


def _i64(value: int) -> bytes:
    return pack(">q", value)


NO_TAGS = b"\x00"  # an empty tagged-field section, which ends every flexible struct


def _header(api_key: int, api_version: int) -> bytes:
    """Request header v2 (flexible requests) for correlation id 5 and client id "c": the client id is a
    classic INT16-length string even there."""
    return _i16(api_key) + _i16(api_version) + _i32(5) + _i16(1) + b"c" + NO_TAGS


def test_the_wire_helpers_encode_as_kafka_does() -> None:
    """The hand-written encoder above agrees with Kafka's varint examples (so the byte tests below mean something)."""
    assert [_uvarint(n) for n in (0, 1, 127, 128, 300)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
    ]
    assert (_text(None), _text(""), _text("ab")) == (b"\x00", b"\x01", b"\x03ab")


@pytest.mark.parametrize("stable", [True, False])
def test_offset_fetch_v7_is_on_the_wire_as_kafkas_schema_lays_it_out(stable: bool) -> None:
    """OffsetFetch v7 (key 9), byte for byte: GroupId, Topics [Name, PartitionIndexes], RequireStable, tags."""
    struct_ = OffsetFetchRequest("group-1", [B0, A1, A0], require_stable=stable).prepare(KAFKA_4)
    assert struct_.build_request_header(5, "c").encode() == _header(9, 7)
    assert struct_.encode() == (
        _text("group-1")
        + _array(
            _text("a") + _array(_i32(0), _i32(1)) + NO_TAGS,
            _text("b") + _array(_i32(0)) + NO_TAGS,
        )
        + (b"\x01" if stable else b"\x00")
        + NO_TAGS
    )


def test_txn_offset_commit_v3_is_on_the_wire_as_kafkas_schema_lays_it_out() -> None:
    """TxnOffsetCommit v3 (key 28), byte for byte: TransactionalId, GroupId, ProducerId (int64), ProducerEpoch
    (int16), GenerationId, MemberId, GroupInstanceId, then per topic and partition the index, the offset (int64),
    the leader epoch -1 and the metadata (null stays null)."""
    group = GroupMetadata("grp", 7, "member-1", "instance-1")
    offsets: dict[TopicPartition, tuple[int, str | None]] = {B0: (2**40, None), A0: (4, "m")}
    struct_ = TxnOffsetCommitRequest("tx-1", 2**33, 300, group, offsets).prepare(KAFKA_4)
    assert struct_.build_request_header(5, "c").encode() == _header(28, 3)
    partition_a0 = _i32(0) + _i64(4) + _i32(-1) + _text("m") + NO_TAGS
    partition_b0 = _i32(0) + _i64(2**40) + _i32(-1) + _text(None) + NO_TAGS
    assert struct_.encode() == (
        _text("tx-1")
        + _text("grp")
        + _i64(2**33)
        + _i16(300)
        + _i32(7)
        + _text("member-1")
        + _text("instance-1")
        + _array(_text("a") + _array(partition_a0) + NO_TAGS, _text("b") + _array(partition_b0) + NO_TAGS)
        + NO_TAGS
    )


def test_a_static_member_and_a_dynamic_one_differ_on_the_wire_only_in_the_group_instance_id() -> None:
    """A null GroupInstanceId is the single byte 0, where "i" is its length 2 and the letter."""

    def wire(instance: str | None) -> bytes:
        group = GroupMetadata("g", 1, "m", instance)
        encoded: bytes = TxnOffsetCommitRequest("t", 1, 0, group, {}).prepare(KAFKA_4).encode()
        return encoded

    prefix = _text("t") + _text("g") + _i64(1) + _i16(0) + _i32(1) + _text("m")
    assert wire(None) == prefix + b"\x00" + _array() + NO_TAGS
    assert wire("i") == prefix + b"\x02i" + _array() + NO_TAGS


def test_metadata_v12_is_on_the_wire_as_kafkas_schema_lays_it_out() -> None:
    """Metadata v12 (key 3), byte for byte: each topic by name with the zero topic id, no auto-creation, no
    authorized operations."""
    struct_ = MetadataRequest(["in", "out"]).prepare(KAFKA_4)
    assert struct_.build_request_header(5, "c").encode() == _header(3, 12)
    zero_id = bytes(16)
    assert struct_.encode() == (
        _array(zero_id + _text("in") + NO_TAGS, zero_id + _text("out") + NO_TAGS)
        + b"\x00"
        + b"\x00"
        + NO_TAGS
    )
    decoded = type(struct_).decode(BytesIO(struct_.encode()))
    assert decoded.topics == [(uuid.UUID(int=0), "in", {}), (uuid.UUID(int=0), "out", {})]
    assert (decoded.allow_auto_topic_creation, decoded.include_topic_authorized_operations) == (False, False)


def test_metadata_v12_response_decodes_the_cluster_id_and_each_topic_id() -> None:
    """The v12 answer, built as a broker sends it: the brokers, the cluster id, the controller, and per topic
    its error, name, 16-byte id, partitions and authorized operations."""
    topic_id = uuid.UUID("0123456789abcdef0123456789abcdef")
    wire = (
        _i32(0)
        + _array(_i32(1) + _text("kafka") + _i32(9092) + _text(None) + NO_TAGS)
        + _text("cluster-x")
        + _i32(1)
        + _array(
            _i16(0)
            + _text("in")
            + topic_id.bytes
            + b"\x00"
            + _array(
                _i16(0) + _i32(0) + _i32(1) + _i32(5) + _array(_i32(1)) + _array(_i32(1)) + _array() + NO_TAGS
            )
            + _i32(-2147483648)
            + NO_TAGS
        )
        + NO_TAGS
    )
    decoded = MetadataResponseV12.decode(BytesIO(wire))
    assert (MetadataResponseV12.API_KEY, MetadataResponseV12.API_VERSION) == (3, 12)
    assert decoded.cluster_id == "cluster-x"
    assert decoded.controller_id == 1
    assert decoded.brokers == [(1, "kafka", 9092, None, {})]
    assert decoded.topics == [(0, "in", topic_id, False, [(0, 0, 1, 5, [1], [1], [], {})], -2147483648, {})]


def test_a_uuid_is_sixteen_bytes_and_a_short_one_is_refused() -> None:
    """Kafka's uuid takes exactly 16 bytes off the wire (the next field starts after them); fewer is an underrun."""
    topic_id = uuid.UUID("0123456789abcdef0123456789abcdef")
    data = BytesIO(topic_id.bytes + b"next")
    assert requests._Uuid.decode(data) == topic_id
    assert data.read() == b"next"
    assert requests._Uuid.encode(topic_id) == topic_id.bytes
    with pytest.raises(ValueError, match=r"^Buffer underrun decoding a UUID$"):
        requests._Uuid.decode(BytesIO(topic_id.bytes[:15]))


TXN = TxnOffsetCommitRequest("tx", 1, 0, GroupMetadata("g", 1, "m", None), {A0: (1, "")})


@pytest.mark.parametrize(
    ("request_", "served", "sent"),
    [
        (OffsetFetchRequest("g", [A0], require_stable=True), {9: (7, 7)}, (9, 7)),
        (OffsetFetchRequest("g", [A0], require_stable=True), {9: (0, 7)}, (9, 7)),
        (TXN, {28: (3, 3)}, (28, 3)),
        (TXN, {28: (0, 3)}, (28, 3)),
    ],
    ids=[
        "offset-fetch-v7-only",
        "offset-fetch-up-to-v7",
        "txn-offset-commit-v3-only",
        "txn-offset-commit-up-to-v3",
    ],
)
def test_a_broker_serving_exactly_the_version_is_asked_with_it(
    request_: OffsetFetchRequest | TxnOffsetCommitRequest,
    served: dict[int, tuple[int, int]],
    sent: tuple[int, int],
) -> None:
    """The version range is inclusive at both ends: a broker whose lowest or highest version is the one needed
    (Kafka 2.5's TxnOffsetCommit is v0-v3) is asked with it."""
    prepared = request_.prepare(served)
    assert sent == (prepared.API_KEY, prepared.API_VERSION)


@pytest.mark.parametrize(
    ("request_", "served", "message"),
    [
        (
            OffsetFetchRequest("g", [A0], require_stable=True),
            {9: (1, 6)},
            "the broker does not serve OffsetFetch v7 (it serves v1-v6); Kafka 2.5 or later does",
        ),
        (
            OffsetFetchRequest("g", [A0], require_stable=True),
            {9: (8, 9)},
            "the broker does not serve OffsetFetch v7 (it serves v8-v9); Kafka 2.5 or later does",
        ),
        (
            TXN,
            {28: (0, 2), 9: (0, 9)},
            "the broker does not serve TxnOffsetCommit v3 (it serves v0-v2); Kafka 2.5 or later does",
        ),
        (
            TXN,
            {9: (0, 9)},
            "the broker does not serve TxnOffsetCommit v3 (it serves v0-v-1); Kafka 2.5 or later does",
        ),
    ],
    ids=["below", "above", "txn-below", "txn-not-listed"],
)
def test_the_refusal_names_the_request_the_version_and_what_the_broker_serves(
    request_: OffsetFetchRequest | TxnOffsetCommitRequest, served: dict[int, tuple[int, int]], message: str
) -> None:
    """Each refusal says which request at which version, and the range the broker gave for that request's own
    API key (an API the broker does not list at all reads as the empty range v0-v-1)."""
    with pytest.raises(IncompatibleBrokerVersion) as refused:
        request_.prepare(served)
    assert str(refused.value) == f"IncompatibleBrokerVersion: {message}"


def test_offset_fetch_builds_from_the_partitions_given_not_from_the_broker() -> None:
    """build() is the v7 struct of the group, the partitions and require_stable given to the request."""
    built = OffsetFetchRequest("g", [A1, A0], require_stable=False).build(OffsetFetchRequestV7)
    assert (built.group_id, built.topics, built.require_stable, built.tags) == (
        "g",
        [("a", [0, 1], {})],
        False,
        {},
    )


def test_a_committed_offset_of_zero_is_an_offset_not_nothing() -> None:
    """Offset 0 (a group that committed before its first record) is 0; only a negative offset is "nothing"."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, 0, 0), ("a", 1, -1, 0), ("b", 0, 1, 0)), [A0, A1, B0])
    assert answer.committed == {A0: 0, A1: None, B0: 1}


def test_the_other_error_codes_are_kafkas() -> None:
    """UNSTABLE_OFFSET_COMMIT 88, PRODUCER_FENCED 90, FENCED_INSTANCE_ID 82; the coordinator moved: COORDINATOR_NOT_AVAILABLE
    15, NOT_COORDINATOR 16, REQUEST_TIMED_OUT 7 (Kafka's Errors)."""
    assert (requests.UNSTABLE_OFFSET_COMMIT, requests.PRODUCER_FENCED, requests.FENCED_INSTANCE_ID) == (
        88,
        90,
        82,
    )
    assert {15, 16, 7} == requests.COORDINATOR_MOVED


def test_a_pending_transaction_alone_does_not_send_the_reader_looking_for_the_coordinator() -> None:
    """UNSTABLE_OFFSET_COMMIT (88) on a partition is asked again at the same coordinator: coordinator_moved stays False."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, -1, 88)), [A0])
    assert answer.again == [A0]
    assert answer.coordinator_moved is False


@pytest.mark.parametrize(
    ("code", "moved"),
    [(16, True), (15, True), (7, True), (14, False), (88, False)],
    ids=["not-coordinator", "coordinator-not-available", "request-timed-out", "loading", "unstable"],
)
def test_a_partition_level_answer_to_ask_again_names_that_partition_alone(code: int, moved: bool) -> None:
    """A partition answered NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or REQUEST_TIMED_OUT is asked again after
    finding the coordinator; COORDINATOR_LOAD_IN_PROGRESS or UNSTABLE_OFFSET_COMMIT just again; the rest answered."""
    answer = read_offset_fetch(
        _fetch_answer(("a", 0, 3, 0), ("a", 1, -1, code), ("b", 0, 5, 0)), [A0, A1, B0]
    )
    assert answer.committed == {A0: 3, B0: 5}
    assert answer.again == [A1]
    assert answer.coordinator_moved is moved


def test_once_one_partition_says_the_coordinator_moved_a_later_one_does_not_undo_it() -> None:
    """NOT_COORDINATOR on one partition and UNSTABLE_OFFSET_COMMIT on the next: both again, the coordinator looked up."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, -1, 16), ("a", 1, -1, 88)), [A0, A1])
    assert answer.again == [A0, A1]
    assert answer.coordinator_moved is True


@pytest.mark.parametrize(("code", "moved"), [(16, True), (15, True), (7, True), (14, False)])
def test_a_top_level_answer_to_ask_again_asks_for_every_partition(code: int, moved: bool) -> None:
    """A top-level coordinator answer: every partition asked, none answered; found again only if it moved."""
    answer = read_offset_fetch(_fetch_answer(("a", 0, 3, 0), error=code), [A0, B0])
    assert answer.again == [A0, B0]
    assert answer.committed == {}
    assert answer.coordinator_moved is moved


def test_a_partitions_refusal_is_raised_naming_the_partition() -> None:
    """A partition's own error (here UNKNOWN_TOPIC_OR_PARTITION) is raised as its KafkaError, naming the partition."""
    with pytest.raises(UnknownTopicOrPartitionError) as raised:
        read_offset_fetch(_fetch_answer(("a", 0, 3, 0), ("b", 0, -1, 3)), [A0, B0])
    assert str(raised.value) == f"[Error 3] UnknownTopicOrPartitionError: {B0}"
