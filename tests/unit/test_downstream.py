"""pipeline.downstream without a broker or a database: the command model and the consumer settings."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pipeline.contract import command_value
from pipeline.downstream import Command, CommandRecordError, consumer_settings
from pipeline.errors import InvalidRecordError

EVENT = {"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}


def record(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "command": "invoice-final",
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
        command="invoice-final",
        key="stripe:evt_1",
        effect_key="stripe:evt_1",
        source="stripe",
        event_type="invoice.paid",
        received_at=1_700_000_000_123,
        body=orjson.dumps(EVENT),
    )
    command = Command.from_record(b"stripe:evt_1", value)
    assert command == Command(
        "invoice-final", "stripe:evt_1", "stripe:evt_1", "stripe", "invoice.paid", 1_700_000_000_123, EVENT
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
