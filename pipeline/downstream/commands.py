"""The typed command record and the consumer settings every command consumer needs.

:class:`Command` is the contract's command value (``docs/design.md``, section
3, "The record contract"), typed and checked, plus where it was read from
(:class:`Origin`: topic, partition, offset). It imports nothing optional.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from pipeline.errors import InvalidRecordError

__all__ = ["Command", "CommandRecordError", "Origin", "consumer_settings"]

_REQUIRED_STRINGS: Final = ("command", "key", "effect_key", "source")


class CommandRecordError(InvalidRecordError):
    """A command record does not match the contract; ``field`` names the offending field."""

    reason = "bad-command"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid command record: field {field!r} {problem}")


class KafkaRecord(Protocol):
    """What :meth:`Command.from_consumer_record` reads of a consumer record (aiokafka's has it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def consumer_settings(bootstrap: str, group: str) -> dict[str, Any]:
    """The aiokafka consumer settings a command consumer must use: ``AIOKafkaConsumer(topic, **settings)``.

    - ``isolation_level="read_committed"``: commands are written inside Kafka
      transactions. A read_uncommitted consumer also sees the records of
      transactions that were later aborted (a worker that crashed or was
      fenced mid-batch); those commands were never decided and are re-sent by
      the worker that takes over, so applying them would double or invent effects.
    - ``enable_auto_commit=False``: auto-commit commits on a timer, possibly
      before the effect of a fetched record is durable; a crash then skips
      that command for good. Offsets are committed after the database commit
      (:class:`~pipeline.downstream.CommandStream` does it), or kept in the
      database itself.
    - ``auto_offset_reset="earliest"``: a new group (or one whose committed
      offsets expired) starts from the oldest retained command instead of
      silently skipping everything written before it joined. Replays are
      harmless because the effects are applied once per effect key.
    - ``group_id``: partitions are shared across the service's instances and
      offsets are stored per group; one group per downstream service.
    - no key/value deserializer: records arrive as bytes and are parsed by
      :meth:`Command.from_record`, which reports a bad record clearly instead
      of failing inside the client's fetch loop.
    """
    return {
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "isolation_level": "read_committed",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }


def _string(data: Mapping[str, Any], name: str) -> str:
    if name not in data:
        raise CommandRecordError(name, "is missing")
    value = data[name]
    if not isinstance(value, str):
        raise CommandRecordError(name, f"must be a string, got {type(value).__name__}")
    if not value:
        raise CommandRecordError(name, "must not be empty")
    return value


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a command was read: its topic, partition and offset, and the record's timestamp (ms)."""

    topic: str
    partition: int
    offset: int
    timestamp: int = 0

    @property
    def next_offset(self) -> int:
        """The offset to commit (or store) once this command's effect is durable."""
        return self.offset + 1


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a command topic: the contract's JSON value, typed, and its :class:`Origin`.

    - ``command``: the route's command name (``fulfil-order``, ``close-invoice``,
      ``build``; ``handle`` for the default command topic).
    - ``key``: the idempotency key of the webhook, ``<source>:<provider event id>``
      (also :attr:`idempotency_key`).
    - ``effect_key``: what the command is applied once per; the Kafka record key.
      ``<command>:<value>`` for a route with an ``effect_key``, else the event key.
    - ``source``, ``event_type`` (``None`` when the body has none),
      ``received_at`` (ms since the epoch, set by the ingress): provenance.
    - ``event``: the provider's parsed webhook body (a JSON object).
    - ``origin``: topic, partition and offset it was read from; ``None`` for a
      command built in code or parsed with :meth:`from_record`.
    """

    command: str
    key: str
    effect_key: str
    source: str
    event_type: str | None
    received_at: int
    event: Mapping[str, Any] = field(hash=False)
    origin: Origin | None = None

    @property
    def idempotency_key(self) -> str:
        """The webhook's idempotency key, ``<source>:<provider event id>`` (the contract's ``key``)."""
        return self.key

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes, origin: Origin | None = None) -> Command:
        """Parse and check a command record; :class:`CommandRecordError` names the bad field.

        ``key`` is the Kafka record key (the effect key in UTF-8); when given it
        must equal the value's ``effect_key``. Fields the contract does not name
        are ignored, so newer producers can add fields.
        """
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise CommandRecordError("value", f"is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CommandRecordError("value", f"must be a JSON object, got {type(data).__name__}")
        command, idem_key, effect_key, source = (_string(data, name) for name in _REQUIRED_STRINGS)
        if "event_type" not in data:
            raise CommandRecordError("event_type", "is missing")
        event_type = data["event_type"]
        if event_type is not None and not isinstance(event_type, str):
            raise CommandRecordError(
                "event_type", f"must be a string or null, got {type(event_type).__name__}"
            )
        if "received_at" not in data:
            raise CommandRecordError("received_at", "is missing")
        received_at = data["received_at"]
        if isinstance(received_at, bool) or not isinstance(received_at, int):
            raise CommandRecordError(
                "received_at", f"must be an integer (ms since epoch), got {type(received_at).__name__}"
            )
        if "event" not in data:
            raise CommandRecordError("event", "is missing")
        event = data["event"]
        if not isinstance(event, dict):
            raise CommandRecordError("event", f"must be a JSON object, got {type(event).__name__}")
        if key is not None:
            try:
                record_key = key.decode("utf-8")
            except UnicodeDecodeError:
                raise CommandRecordError("record key", "is not valid UTF-8") from None
            if record_key != effect_key:
                raise CommandRecordError(
                    "record key", f"{record_key!r} differs from the value's effect_key {effect_key!r}"
                )
        return cls(command, idem_key, effect_key, source, event_type, received_at, event, origin)

    @classmethod
    def from_consumer_record(cls, record: KafkaRecord) -> Command:
        """Parse a consumer record (aiokafka's ``ConsumerRecord``), keeping its topic, partition and offset."""
        origin = Origin(record.topic, record.partition, record.offset, record.timestamp)
        if record.value is None:
            raise CommandRecordError("value", "is missing (a tombstone)")
        return cls.from_record(record.key, record.value, origin)

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON object as a dict (without the origin, which is not part of the value)."""
        return {
            "command": self.command,
            "key": self.key,
            "effect_key": self.effect_key,
            "source": self.source,
            "event_type": self.event_type,
            "received_at": self.received_at,
            "event": dict(self.event),
        }

    def to_json(self) -> bytes:
        """The contract's JSON value (UTF-8 bytes), as the worker writes it."""
        return orjson.dumps(self.to_dict())
