"""What the worker learns of its topics' timestamps, and what ``topics create`` sets on the input."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka import admin
from pipeline.kafka.admin import NO_LIMIT_MS, topic_specs
from pipeline.kafka.topic_layout import timestamp_bounds
from pipeline.topology import load
from tests.unit.worker.fakes import TOPOLOGY_PATH


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        ({}, None),  # Kafka 3.x defaults: any time
        ({"message.timestamp.after.max.ms": "3600000"}, (NO_LIMIT_MS, 3_600_000)),  # Kafka 4.x's default
        (
            {"message.timestamp.before.max.ms": "86400000", "message.timestamp.after.max.ms": "3600000"},
            (86_400_000, 3_600_000),
        ),
        ({"message.timestamp.difference.max.ms": "60000"}, (60_000, 60_000)),  # the older setting, both ways
        ({"message.timestamp.type": "LogAppendTime", "message.timestamp.after.max.ms": "1"}, None),
    ],
)
def test_a_topics_timestamp_bounds_are_read_from_its_configs(
    configs: dict[str, str], expected: tuple[int, int] | None
) -> None:
    """(before, after) ms a topic accepts, None when it takes any time (the worker then stamps nothing)."""
    assert timestamp_bounds(configs) == expected


def test_topics_create_lets_the_input_take_any_timestamp_and_leaves_the_others_alone() -> None:
    """A producer whose clock runs ahead is not refused on the input (Kafka 4 refuses over an hour ahead):
    the worker bounds such records itself."""
    specs = {s.name: s for s in topic_specs(load(TOPOLOGY_PATH))}
    topics = load(TOPOLOGY_PATH).topics
    assert specs[topics.input].configs["message.timestamp.after.max.ms"] == str(NO_LIMIT_MS)
    assert "message.timestamp.after.max.ms" not in specs[topics.commands].configs


async def test_a_broker_lost_between_two_admin_requests_is_broker_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection closed after the admin client started (an outage as a worker starts) is a
    BrokerUnavailableError, which the worker's supervisor answers by starting it again, not a raw aiokafka error."""

    class Started:
        def __init__(self, **_kwargs: object) -> None:
            self.closed = False

        async def start(self) -> None:
            pass

        async def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(admin, "AIOKafkaAdminClient", Started)
    with pytest.raises(BrokerUnavailableError, match=r"lost Kafka at 127\.0\.0\.1:1"):
        async with admin.admin_client("127.0.0.1:1") as client:
            raise KafkaConnectionError("Connection at 127.0.0.1:1 closed")
    assert client.closed


def test_the_redrive_history_is_one_compacted_partition_outside_the_rescaled_topics() -> None:
    """``topics create`` adds the console's history: compacted, one partition, and never in the
    specs ``rescale`` raises to N partitions."""
    topo = load(TOPOLOGY_PATH)
    spec = admin.redrive_history_spec(topo)
    assert (spec.name, spec.partitions, spec.configs["cleanup.policy"]) == (
        topo.topics.redrives,
        1,
        "compact",
    )
    assert spec.name not in {s.name for s in topic_specs(topo, 8)}
