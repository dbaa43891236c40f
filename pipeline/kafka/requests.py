"""Requests aiokafka 0.14 does not declare, at the versions the pipeline needs, declared by hand.

aiokafka ships the protocol machinery (:mod:`aiokafka.protocol`) but speaks only older
versions of these requests; each is declared here after Kafka's own message schema and
sent like aiokafka's requests (a :class:`~aiokafka.protocol.api.Request` picks the struct the
broker's version range allows). Each struct round-trips in ``tests/unit/kafka/test_requests.py``.

- Metadata v12 (:class:`MetadataRequest`): the cluster id and the topic ids (aiokafka's own
  stops at v5, without topic ids).
- TxnOffsetCommit v3 (:class:`TxnOffsetCommitRequest`, KIP-447): a transaction's consumer
  offsets with the group's generation, member id and group instance id, so that the group
  coordinator refuses the offsets of a member whose generation is over (a zombie). aiokafka's
  producer sends v0, which carries none of them and which the coordinator always accepts.
- OffsetFetch v7 (:class:`OffsetFetchRequest`, KIP-447): committed offsets with
  ``require_stable``: a partition whose offsets a pending transaction holds is answered
  UNSTABLE_OFFSET_COMMIT instead of with the offset before that transaction.

Nothing here reaches into aiokafka's private parts; the functions that send these through a
producer's or a consumer's own connections are in :mod:`pipeline.kafka.internals`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    IllegalGenerationError,
    IncompatibleBrokerVersion,
    NotCoordinatorForGroupError,
    RequestTimedOutError,
    UnknownMemberIdError,
    for_code,
)
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

NO_LEADER_EPOCH = -1

# -- error codes aiokafka 0.14 has no class for ------------------------------------------------------
FENCED_INSTANCE_ID = 82
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90

#: TxnOffsetCommit's answers that mean the group metadata is not the current generation's member
GROUP_FENCED = {IllegalGenerationError.errno, UnknownMemberIdError.errno, FENCED_INSTANCE_ID}
#: answers that mean the group coordinator is elsewhere (or was asked too late): find it again, ask again
COORDINATOR_MOVED = {
    GroupCoordinatorNotAvailableError.errno,
    NotCoordinatorForGroupError.errno,
    RequestTimedOutError.errno,
}

#: answers to an OffsetFetch that asking again (after finding the coordinator, for those above) will change
_ASK_AGAIN = COORDINATOR_MOVED | {GroupLoadInProgressError.errno}


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """The consumer a transaction's offsets belong to, as the group coordinator checks it (Java's
    ``ConsumerGroupMetadata``)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


class _Uuid(AbstractType[uuid.UUID]):  # type: ignore[misc]  # aiokafka is untyped
    """Kafka's UUID type: 16 bytes."""

    @classmethod
    def encode(cls, value: uuid.UUID) -> bytes:
        return value.bytes

    @classmethod
    def decode(cls, data: BytesIO) -> uuid.UUID:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("Buffer underrun decoding a UUID")
        return uuid.UUID(bytes=raw)


_NAME = CompactString("utf-8")


def _only(name: str, version: int, versions: Mapping[int, tuple[int, int]], api_key: int) -> None:
    """Raise a clear error when the broker does not serve ``version`` of ``name`` (aiokafka would say
    only "not yet added")."""
    low, high = versions.get(api_key, (0, -1))
    if not low <= version <= high:
        raise IncompatibleBrokerVersion(
            f"the broker does not serve {name} v{version} (it serves v{low}-v{high}); Kafka 2.5 or later does"
        )


# -- Metadata v12 ----------------------------------------------------------------------------------


class MetadataResponseV12(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", _NAME),
                ("port", Int32),
                ("rack", _NAME),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", _NAME),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", _NAME),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MetadataRequestV12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = MetadataResponseV12
    SCHEMA = Schema(
        ("topics", CompactArray(("topic_id", _Uuid), ("name", _NAME), ("tags", TaggedFields))),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class MetadataRequest(Request[MetadataRequestV12]):  # type: ignore[misc]  # aiokafka is untyped
    """Metadata of ``topics`` (v12): with the cluster id and each topic's id."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[MetadataRequestV12]) -> MetadataRequestV12:
        """The request as the v12 struct."""
        zero = uuid.UUID(int=0)
        return request_struct_class([(zero, name, {}) for name in self._topics], False, False, {})


# -- TxnOffsetCommit v3 (KIP-447) ------------------------------------------------------------------


class TxnOffsetCommitResponseV3(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", _NAME),
                (
                    "partitions",
                    CompactArray(("partition_index", Int32), ("error_code", Int16), ("tags", TaggedFields)),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequestV3(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponseV3
    SCHEMA = Schema(
        ("transactional_id", _NAME),
        ("group_id", _NAME),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", _NAME),
        ("group_instance_id", _NAME),  # nullable
        (
            "topics",
            CompactArray(
                ("name", _NAME),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", _NAME),  # nullable
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest(Request[TxnOffsetCommitRequestV3]):  # type: ignore[misc]  # aiokafka is untyped
    """A transaction's offsets of ``group_id`` with the group member's generation, member id and group
    instance id (v3): the group coordinator refuses them unless that member is in the current generation."""

    API_KEY = 28

    def __init__(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group: GroupMetadata,
        offsets: Mapping[TopicPartition, tuple[int, str | None]],
    ) -> None:
        self._fields = (
            transactional_id,
            group.group_id,
            producer_id,
            producer_epoch,
            group.generation_id,
            group.member_id,
            group.group_instance_id,
        )
        by_topic: dict[str, list[tuple[int, int, int, str | None, dict[int, bytes]]]] = {}
        for tp, (offset, metadata) in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append((tp.partition, offset, NO_LEADER_EPOCH, metadata, {}))
        self._topics: list[tuple[str, list[Any], dict[int, bytes]]] = [
            (topic, partitions, {}) for topic, partitions in by_topic.items()
        ]

    def prepare(self, versions: dict[int, tuple[int, int]]) -> TxnOffsetCommitRequestV3:
        """The v3 struct; IncompatibleBrokerVersion when the broker does not serve v3 (before Kafka 2.5)."""
        _only("TxnOffsetCommit", 3, versions, self.API_KEY)
        return self.build(TxnOffsetCommitRequestV3)

    def build(self, request_struct_class: type[TxnOffsetCommitRequestV3]) -> TxnOffsetCommitRequestV3:
        """The request as the v3 struct."""
        return request_struct_class(*self._fields, self._topics, {})


# -- OffsetFetch v7 with require_stable (KIP-447) -------------------------------------------------


class OffsetFetchResponseV7(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", _NAME),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", _NAME),  # nullable
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequestV7(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponseV7
    SCHEMA = Schema(
        ("group_id", _NAME),
        (
            "topics",
            CompactArray(("name", _NAME), ("partition_indexes", CompactArray(Int32)), ("tags", TaggedFields)),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest(Request[OffsetFetchRequestV7]):  # type: ignore[misc]  # aiokafka is untyped
    """The committed offsets of ``group_id`` for ``partitions`` (v7); with ``require_stable``, a partition
    whose offsets a pending transaction holds is answered UNSTABLE_OFFSET_COMMIT."""

    API_KEY = 9

    def __init__(self, group_id: str, partitions: Sequence[TopicPartition], *, require_stable: bool) -> None:
        self._group_id = group_id
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(set(partitions)):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        self._topics: list[tuple[str, list[int], dict[int, bytes]]] = [
            (topic, indexes, {}) for topic, indexes in by_topic.items()
        ]
        self._require_stable = require_stable

    def prepare(self, versions: dict[int, tuple[int, int]]) -> OffsetFetchRequestV7:
        """The v7 struct; IncompatibleBrokerVersion when the broker does not serve v7 (before Kafka 2.5)."""
        _only("OffsetFetch", 7, versions, self.API_KEY)
        return self.build(OffsetFetchRequestV7)

    def build(self, request_struct_class: type[OffsetFetchRequestV7]) -> OffsetFetchRequestV7:
        """The request as the v7 struct."""
        return request_struct_class(self._group_id, self._topics, self._require_stable, {})


@dataclass
class OffsetFetchAnswer:
    """What an OffsetFetch v7 answer says of the partitions asked for."""

    committed: dict[TopicPartition, int | None] = field(default_factory=dict)  # None: nothing committed
    again: list[TopicPartition] = field(default_factory=list)  # unstable, or the coordinator busy: ask again
    coordinator_moved: bool = False  # find the group coordinator again first


def read_offset_fetch(response: OffsetFetchResponseV7, asked: Sequence[TopicPartition]) -> OffsetFetchAnswer:
    """Read an OffsetFetch v7 answer to ``asked`` as Java's consumer does: a partition a pending transaction
    holds, or a coordinator loading or elsewhere, is asked again; any other error (authorization, an unknown
    topic) is raised as its KafkaError."""
    answer = OffsetFetchAnswer()
    top = response.error_code
    if top != 0:
        if top not in _ASK_AGAIN:
            raise for_code(top)()
        answer.again, answer.coordinator_moved = list(asked), top in COORDINATOR_MOVED
        return answer
    for topic, partitions, _tags in response.topics:
        for partition, offset, _epoch, _metadata, code, _ in partitions:
            tp = TopicPartition(topic, partition)
            if code == 0:
                answer.committed[tp] = offset if offset >= 0 else None
            elif code in _ASK_AGAIN or code == UNSTABLE_OFFSET_COMMIT:
                answer.again.append(tp)
                answer.coordinator_moved = answer.coordinator_moved or code in COORDINATOR_MOVED
            else:
                raise for_code(code)(f"{tp}")
    return answer
