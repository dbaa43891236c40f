"""IncrementalAlterConfigs v0 (KIP-339), declared by hand: its wire shape, and set_topic_configs' answers."""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any

import pytest
from aiokafka.errors import IncompatibleBrokerVersion

from pipeline.errors import PipelineError
from pipeline.kafka import alter_configs
from pipeline.kafka.alter_configs import API_KEY, OP_SET, IncrementalAlterConfigsRequest, set_topic_configs

KAFKA_4 = {44: (0, 1)}  # the IncrementalAlterConfigs versions a Kafka 4 broker serves


def string(text: str) -> bytes:
    """A Kafka STRING: its length as int16, then its UTF-8 bytes."""
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def test_the_request_is_api_key_44_version_0_and_sets_as_operation_0() -> None:
    """IncrementalAlterConfigs is API key 44; v0 (Kafka 2.3 and later) is the one prepared; SET is operation 0."""
    prepared = IncrementalAlterConfigsRequest({"t": {"k": "v"}}).prepare(KAFKA_4)
    assert (API_KEY, OP_SET) == (44, 0)
    assert (IncrementalAlterConfigsRequest.API_KEY, prepared.API_KEY, prepared.API_VERSION) == (44, 44, 0)
    assert not prepared.FLEXIBLE_VERSION


def test_one_topic_and_key_encode_to_the_bytes_kafka_reads() -> None:
    """Resources (int32 count), each: type 2 (topic), name, configs (int32 count; name, op 0 SET, value);
    then validate_only false."""
    prepared = IncrementalAlterConfigsRequest({"t": {"k": "v"}}).prepare(KAFKA_4)
    assert prepared.encode() == (
        struct.pack(">i", 1)
        + struct.pack(">b", 2)
        + string("t")
        + struct.pack(">i", 1)
        + string("k")
        + struct.pack(">b", 0)
        + string("v")
        + struct.pack(">?", False)
    )


def test_the_resources_are_sorted_by_topic_and_their_configs_by_key_and_survive_a_round_trip() -> None:
    """Whatever the mapping's order, topics go sorted and each topic's keys sorted, all as SET; not validate-only."""
    request = IncrementalAlterConfigsRequest(
        {"b": {"z": "1", "a": "2"}, "a": {"retention.ms": "5", "cleanup.policy": "compact,delete"}}
    )
    prepared = request.prepare(KAFKA_4)
    decoded = type(prepared).decode(BytesIO(prepared.encode()))
    expected = [
        (2, "a", [("cleanup.policy", 0, "compact,delete"), ("retention.ms", 0, "5")]),
        (2, "b", [("a", 0, "2"), ("z", 0, "1")]),
    ]
    assert [(t, n, list(c)) for t, n, c in prepared.resources] == expected
    assert [(t, n, list(c)) for t, n, c in decoded.resources] == expected
    assert prepared.validate_only is False
    assert decoded.validate_only is False


def test_a_broker_without_incremental_alter_configs_is_refused() -> None:
    """A broker that does not list API key 44 (before Kafka 2.3) gets no request."""
    with pytest.raises(IncompatibleBrokerVersion):
        IncrementalAlterConfigsRequest({"t": {"k": "v"}}).prepare({3: (0, 12)})


def test_the_answer_decodes_each_resources_code_message_type_and_name() -> None:
    """The v0 answer: throttle time, then per resource its error code, message (nullable), type and name."""
    response_type = IncrementalAlterConfigsRequest({"t": {"k": "v"}}).prepare(KAFKA_4).RESPONSE_TYPE
    answer = response_type(0, [(0, None, 2, "a"), (40, "bad", 2, "b")])
    assert response_type.decode(BytesIO(answer.encode())).responses == [
        (0, None, 2, "a"),
        (40, "bad", 2, "b"),
    ]
    assert (response_type.API_KEY, response_type.API_VERSION) == (44, 0)


class Sent:
    """``admin_request``'s stand-in: records each request and answers with ``responses``."""

    def __init__(self, responses: list[tuple[int, str | None, int, str]]) -> None:
        self.responses = responses
        self.requests: list[tuple[Any, IncrementalAlterConfigsRequest]] = []

    async def __call__(self, admin: Any, request: IncrementalAlterConfigsRequest) -> Any:
        self.requests.append((admin, request))
        response_type = request.prepare(KAFKA_4).RESPONSE_TYPE
        return response_type(0, self.responses)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """What set_topic_configs sends, answered with every topic accepted unless a test says otherwise."""
    found = Sent([])
    monkeypatch.setattr(alter_configs, "admin_request", found)
    return found


async def test_an_empty_mapping_sends_nothing(sent: Sent) -> None:
    """No topic to change: no request at all."""
    await set_topic_configs(object(), {})
    assert sent.requests == []


async def test_the_configs_are_sent_in_one_request_over_the_admin_client_given(sent: Sent) -> None:
    """One IncrementalAlterConfigs request carrying every topic, sent over the client passed in."""
    client = object()
    sent.responses = [(0, None, 2, "a"), (0, None, 2, "b")]
    await set_topic_configs(client, {"b": {"k": "1"}, "a": {"k": "2"}})
    [(used, request)] = sent.requests
    assert used is client
    assert isinstance(request, IncrementalAlterConfigsRequest)
    assert [(n, list(c)) for _t, n, c in request.prepare(KAFKA_4).resources] == [
        ("a", [("k", 0, "2")]),
        ("b", [("k", 0, "1")]),
    ]


async def test_a_refused_topic_is_an_error_naming_each_refused_topic_with_its_code_and_message(
    sent: Sent,
) -> None:
    """Every resource with a non-zero code is named, in the answer's order, its message left out when null."""
    sent.responses = [
        (0, None, 2, "a"),
        (40, "Invalid value x for configuration cleanup.policy", 2, "b"),
        (3, None, 2, "c"),
        (42, "", 2, "d"),
    ]
    with pytest.raises(PipelineError) as caught:
        await set_topic_configs(
            object(), {"a": {"k": "v"}, "b": {"k": "v"}, "c": {"k": "v"}, "d": {"k": "v"}}
        )
    assert str(caught.value) == (
        "the broker refused to set topic configs: b: error 40 Invalid value x for configuration cleanup.policy;"
        " c: error 3; d: error 42"
    )


async def test_an_answer_with_every_code_zero_is_success(sent: Sent) -> None:
    """No resource refused: set_topic_configs returns quietly."""
    sent.responses = [(0, None, 2, "a"), (0, "", 2, "b")]
    await set_topic_configs(object(), {"a": {"k": "v"}, "b": {"k": "v"}})
    assert len(sent.requests) == 1
