"""Helpers for services that consume the pipeline's command topics.

The worker writes each command exactly once *into Kafka*, inside a
transaction. Delivery *out of* Kafka is still at least once: a consumer that
crashes after applying a command but before committing its offset sees that
command again after the restart, and so does a consumer group that replays
the topic from the beginning. So a downstream service must

1. read with the settings of :func:`consumer_settings` (read_committed, no
   auto-commit, offsets committed only after the effect is durable), and
2. apply each command at most once per effect key, which :func:`apply_once`
   (psycopg 3, sync) and :func:`apply_once_async` do against PostgreSQL.
   psycopg is the optional ``postgres`` extra (``pip install
   'webhook-pipeline[postgres]'``), imported on first use: without it,
   :class:`Command` and :func:`consumer_settings` work and the PostgreSQL
   helpers raise :class:`~pipeline.errors.MissingExtraError`.

:class:`Command` is the typed form of the contract's command record
(``docs/design.md``, section 3, "The record contract").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from pipeline.errors import InvalidRecordError, MissingExtraError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "APPLIED_TABLE",
    "Command",
    "CommandRecordError",
    "apply_once",
    "apply_once_async",
    "consumer_settings",
    "ensure_schema",
    "ensure_schema_async",
]

APPLIED_TABLE: Final = "applied_commands"

_REQUIRED_STRINGS: Final = ("command", "key", "effect_key", "source")


class CommandRecordError(InvalidRecordError):
    """A command record does not match the contract; ``field`` names the offending field."""

    reason = "bad-command"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid command record: field {field!r} {problem}")


def consumer_settings(bootstrap: str, group: str) -> dict[str, Any]:
    """The aiokafka consumer settings a command consumer must use: ``AIOKafkaConsumer(topic, **settings)``.

    - ``isolation_level="read_committed"``: commands are written inside Kafka
      transactions. A read_uncommitted consumer also sees the records of
      transactions that were later aborted (a worker that crashed or was
      fenced mid-batch); those commands were never decided and are re-sent by
      the worker that takes over, so applying them would double or invent effects.
    - ``enable_auto_commit=False``: auto-commit commits on a timer, possibly
      before the effect of a fetched record is durable; a crash then skips
      that command for good. Commit the offset yourself, after the database
      commit (``consumer.commit({tp: record.offset + 1})``).
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
class Command:
    """One command record of a command topic (the contract's JSON value, typed).

    ``event`` is the provider's parsed webhook body (a JSON object), e.g. a
    Stripe event. ``received_at`` is milliseconds since the epoch, set by the
    ingress. ``event_type`` is ``None`` when the provider's body has none.
    """

    command: str
    key: str
    effect_key: str
    source: str
    event_type: str | None
    received_at: int
    event: Mapping[str, Any] = field(hash=False)

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes) -> Command:
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
        return cls(command, idem_key, effect_key, source, event_type, received_at, event)

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON object as a dict."""
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


def _sql() -> Any:
    """``psycopg.sql``, imported on first use: psycopg is the optional ``postgres`` extra."""
    try:
        from psycopg import sql  # noqa: PLC0415
    except ImportError:
        raise MissingExtraError(
            "pipeline.downstream needs psycopg, which is not installed: "
            "pip install 'webhook-pipeline[postgres]'"
        ) from None
    return sql


def _table(table: str) -> sql.Identifier:
    """``table`` or ``schema.table`` as a quoted SQL identifier."""
    result: sql.Identifier = _sql().Identifier(*table.split("."))
    return result


def _schema_sql(table: str) -> sql.Composed:
    template: sql.SQL = _sql().SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " effect_key text PRIMARY KEY,"
        " command text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    return template.format(_table(table))


def _claim_sql(table: str) -> sql.Composed:
    template: sql.SQL = _sql().SQL(
        "INSERT INTO {} (effect_key, command, applied_at) VALUES (%s, %s, now())"
        " ON CONFLICT (effect_key) DO NOTHING RETURNING effect_key"
    )
    return template.format(_table(table))


def ensure_schema(conn: psycopg.Connection[Any], table: str = APPLIED_TABLE) -> None:
    """Create the table of applied effect keys if it does not exist (committed on return).

    One row per effect key ever applied. Rows may be deleted once they are
    older than the longest replay you must survive (Kafka retention of the
    command topic, a provider's manual replay window); a command replayed
    after that is applied again, so keep the effects themselves idempotent too.
    """
    statement = _schema_sql(table)
    with conn.transaction():
        conn.execute(statement)


async def ensure_schema_async(conn: psycopg.AsyncConnection[Any], table: str = APPLIED_TABLE) -> None:
    """:func:`ensure_schema` for an async connection."""
    statement = _schema_sql(table)
    async with conn.transaction():
        await conn.execute(statement)


def apply_once(
    conn: psycopg.Connection[Any],
    command: Command,
    apply: Callable[[psycopg.Cursor[Any], Command], None],
    *,
    table: str = APPLIED_TABLE,
) -> bool:
    """Apply ``command`` at most once per effect key; True if applied now, False if it was a repeat.

    In one database transaction: claim the effect key
    (``INSERT … ON CONFLICT (effect_key) DO NOTHING RETURNING effect_key``);
    only if the row is new, run ``apply(cursor, command)`` on the same
    cursor; commit. If ``apply`` raises, the transaction rolls back, the claim
    with it, and the exception propagates: a later delivery applies it again.

    Why the claim and the effect share one transaction: they become durable
    together or not at all. Claim first and commit separately, and a crash
    between the two commits leaves the key claimed with no effect, so the
    redelivered command is skipped and the effect is lost. Apply first and
    claim afterwards, and a crash between them applies the effect twice on
    redelivery. Two consumers racing on one effect key (a rebalance, a
    replaying group) are serialised by the primary key: the second INSERT
    waits for the first transaction and then inserts nothing (or claims the
    key if the first rolled back). Only writes made through ``cursor`` (this
    database) are covered; an HTTP call made from ``apply`` is not.

    When the connection is idle, the transaction is committed before this
    returns, so commit the Kafka offset after it. Inside a caller's
    ``with conn.transaction():`` block it becomes a savepoint of that
    transaction and is committed with it (use this to apply a batch of
    commands in one commit). Do not call it on a non-autocommit connection
    with an implicit transaction left open: that transaction, not this call,
    decides when the claim is committed.
    """
    claim = _claim_sql(table)
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute(claim, (command.effect_key, command.command))
        if cursor.fetchone() is None:
            return False
        apply(cursor, command)
    return True


async def apply_once_async(
    conn: psycopg.AsyncConnection[Any],
    command: Command,
    apply: Callable[[psycopg.AsyncCursor[Any], Command], Awaitable[None]],
    *,
    table: str = APPLIED_TABLE,
) -> bool:
    """:func:`apply_once` for ``psycopg.AsyncConnection``; ``apply`` is a coroutine function."""
    claim = _claim_sql(table)
    async with conn.transaction(), conn.cursor() as cursor:
        await cursor.execute(claim, (command.effect_key, command.command))
        if await cursor.fetchone() is None:
            return False
        await apply(cursor, command)
    return True
