"""pipeline.downstream without a broker or a database: the command model, settings and table names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

from pipeline.contract import command_value
from pipeline.downstream import (
    Command,
    CommandRecordError,
    CommandStream,
    Origin,
    ServiceTables,
    apply_once,
    consumer_settings,
)
from pipeline.errors import ConfigError, InvalidRecordError

EVENT = {"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}


def record(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "command": "close-invoice",
        "key": "stripe:evt_1",
        "effect_key": "stripe:evt_1",
        "source": "stripe",
        "event_type": "invoice.paid",
        "received_at": 1_700_000_000_123,
        "event": EVENT,
    }
    value.update(overrides)
    return value


def test_parses_the_workers_command_value() -> None:
    """A value built by the worker's own encoder parses into the typed command."""
    value = command_value(
        command="close-invoice",
        key="stripe:evt_1",
        effect_key="stripe:evt_1",
        source="stripe",
        event_type="invoice.paid",
        received_at=1_700_000_000_123,
        body=orjson.dumps(EVENT),
    )
    command = Command.from_record(b"stripe:evt_1", value)
    assert command == Command(
        "close-invoice", "stripe:evt_1", "stripe:evt_1", "stripe", "invoice.paid", 1_700_000_000_123, EVENT
    )
    assert orjson.loads(command.to_json()) == orjson.loads(value)
    assert Command.from_record(None, command.to_json()) == command


def test_null_event_type_and_unknown_fields_are_accepted() -> None:
    """event_type may be null and fields the contract does not name are ignored."""
    command = Command.from_record(None, orjson.dumps(record(event_type=None, extra="x")))
    assert command.event_type is None


def test_command_is_frozen_and_hashable() -> None:
    """Commands are immutable values."""
    command = Command.from_record(None, orjson.dumps(record()))
    with pytest.raises(AttributeError):
        command.command = "other"  # type: ignore[misc]
    assert hash(command) == hash(Command.from_record(None, orjson.dumps(record())))


@pytest.mark.parametrize(
    ("value", "field", "problem"),
    [
        (b"not json", "value", "not valid JSON"),
        (b"[1, 2]", "value", "JSON object"),
        (orjson.dumps({k: v for k, v in record().items() if k != "effect_key"}), "effect_key", "missing"),
        (orjson.dumps(record(command=3)), "command", "string"),
        (orjson.dumps(record(source="")), "source", "empty"),
        (orjson.dumps({k: v for k, v in record().items() if k != "event_type"}), "event_type", "missing"),
        (orjson.dumps(record(event_type=["x"])), "event_type", "string or null"),
        (orjson.dumps(record(received_at="1700000000123")), "received_at", "integer"),
        (orjson.dumps(record(received_at=True)), "received_at", "integer"),
        (orjson.dumps({k: v for k, v in record().items() if k != "event"}), "event", "missing"),
        (orjson.dumps(record(event="{}")), "event", "JSON object"),
    ],
)
def test_rejects_bad_records_naming_the_field(value: bytes, field: str, problem: str) -> None:
    """A record that breaks the contract raises CommandRecordError naming the field and the problem."""
    with pytest.raises(CommandRecordError) as info:
        Command.from_record(None, value)
    assert info.value.field == field
    assert problem in str(info.value)
    assert repr(field) in str(info.value)
    assert isinstance(info.value, InvalidRecordError)


def test_record_key_must_match_the_effect_key() -> None:
    """The Kafka record key is the effect key; a different key (or non-UTF-8 bytes) is rejected."""
    with pytest.raises(CommandRecordError, match="differs from the value's effect_key") as info:
        Command.from_record(b"stripe:evt_other", orjson.dumps(record()))
    assert info.value.field == "record key"
    with pytest.raises(CommandRecordError, match="UTF-8"):
        Command.from_record(b"\xff", orjson.dumps(record()))


def test_consumer_settings_read_committed_without_auto_commit() -> None:
    """Command consumers read committed records only, commit offsets themselves and start at the earliest."""
    settings = consumer_settings("127.0.0.1:9092", "orders")
    assert settings["isolation_level"] == "read_committed"
    assert settings["enable_auto_commit"] is False
    assert settings["auto_offset_reset"] == "earliest"
    assert settings["bootstrap_servers"] == "127.0.0.1:9092"
    assert settings["group_id"] == "orders"
    assert consumer_settings("a", "b") is not consumer_settings("a", "b")


@dataclass
class FakeRecord:
    """The fields of an aiokafka ConsumerRecord that Command reads."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def test_from_consumer_record_keeps_the_provenance() -> None:
    """A command read from a record carries idempotency key, effect key, source, type and topic/partition/offset."""
    value = orjson.dumps(record(effect_key="close-invoice:in_1", command="close-invoice"))
    command = Command.from_consumer_record(FakeRecord("shop.invoices", 4, 17, 1_700_000_000_200, None, value))
    assert command.origin == Origin("shop.invoices", 4, 17, 1_700_000_000_200)
    assert command.origin.next_offset == 18
    assert command.idempotency_key == "stripe:evt_1"
    assert (command.effect_key, command.source, command.event_type) == (
        "close-invoice:in_1",
        "stripe",
        "invoice.paid",
    )
    assert "origin" not in orjson.loads(command.to_json())
    with pytest.raises(CommandRecordError, match="tombstone"):
        Command.from_consumer_record(FakeRecord("t", 0, 1, 0, None, None))


@pytest.mark.parametrize("service", ["", "Orders", "1orders", "orders-svc", "a" * 41, "x;drop"])
def test_service_names_are_required_sql_names(service: str) -> None:
    """The service name names the tables: it must be a lower-case SQL name; there is no default."""
    with pytest.raises(ConfigError, match="service name"):
        ServiceTables(service)


def test_each_service_has_its_own_tables() -> None:
    """Two services never share the applied-commands or offsets table."""
    orders, billing = ServiceTables("orders"), ServiceTables("billing")
    assert orders.applied_name == "orders_applied_commands"
    assert orders.offsets_name == "orders_kafka_offsets"
    assert {orders.applied_name, orders.offsets_name}.isdisjoint({billing.applied_name, billing.offsets_name})


def test_apply_once_needs_a_service_and_store_offset_needs_an_origin() -> None:
    """apply_once has no default table, and storing an offset for a command not read from Kafka is refused."""
    command = Command.from_record(None, orjson.dumps(record()))
    with pytest.raises(TypeError, match="service"):
        apply_once(object(), command, lambda cursor, c: None)  # type: ignore[call-arg, arg-type]
    with pytest.raises(ConfigError, match="no origin"):
        apply_once(object(), command, lambda cursor, c: None, service="orders", store_offset=True)  # type: ignore[arg-type]


def test_command_stream_refuses_settings_that_break_the_contract() -> None:
    """The stream's consumer is always read_committed with manual commits, and needs a group and a topic."""
    with pytest.raises(ConfigError, match="isolation_level"):
        CommandStream(
            "127.0.0.1:1", ["t"], group="g", consumer_options={"isolation_level": "read_uncommitted"}
        )
    with pytest.raises(ConfigError, match="enable_auto_commit"):
        CommandStream("127.0.0.1:1", ["t"], group="g", consumer_options={"enable_auto_commit": True})
    with pytest.raises(ConfigError, match="group"):
        CommandStream("127.0.0.1:1", ["t"], group="")
    with pytest.raises(ConfigError, match="topic"):
        CommandStream("127.0.0.1:1", [], group="g")


class _RebalancingConsumer:
    """A consumer whose commit fails because the group is rebalancing (no broker)."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        raise CommitFailedError("the group rebalanced")


async def test_a_commit_refused_during_a_rebalance_does_not_end_the_stream() -> None:
    """CommitFailedError on the periodic commit is logged, not raised: the next owner redoes those commands as repeats."""
    tp = TopicPartition("cmds", 0)
    stream = CommandStream("127.0.0.1:1", ["cmds"], group="g")
    stream.consumer = _RebalancingConsumer(tp)
    stream._record_done(tp, 5)
    await stream.commit()
    assert stream.committed == 0
