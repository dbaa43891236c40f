"""Apply each command once against PostgreSQL: the claim, the effect and (optionally) the offset in ONE transaction.

Every service has its own tables, named after the service (the name is
required; there is no shared default): ``<service>_applied_commands`` holds one
row per effect key applied, ``<service>_kafka_offsets`` the next offset per
topic partition when the service keeps its offsets in the database
(:class:`PostgresOffsets`, ``CommandStream(offsets=...)``). Two services
reading the same command topic therefore never see each other's claims.

psycopg is the optional ``postgres`` extra, imported on first use.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pipeline.downstream.commands import Command
from pipeline.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "PostgresOffsets",
    "ServiceTables",
    "apply_once",
    "apply_once_async",
    "ensure_schema",
    "ensure_schema_async",
    "load_offsets_async",
    "store_offset_async",
]

_SERVICE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")

SyncApply = Callable[["psycopg.Cursor[Any]", Command], None]
AsyncApply = Callable[["psycopg.AsyncCursor[Any]", Command], Awaitable[None]]


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


@dataclass(frozen=True, slots=True)
class ServiceTables:
    """The tables of one downstream service: ``<service>_applied_commands`` and ``<service>_kafka_offsets``.

    ``service`` is required and must be a lower-case SQL name (``[a-z][a-z0-9_]*``,
    at most 40 characters); ``schema`` optionally qualifies both tables.
    """

    service: str
    schema: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.service, str) or not _SERVICE.fullmatch(self.service):
            raise ConfigError(
                f"downstream service name {self.service!r} must match [a-z][a-z0-9_]* (at most 40 "
                "characters): it names the service's own tables"
            )
        if self.schema is not None and not _SERVICE.fullmatch(self.schema):
            raise ConfigError(f"schema name {self.schema!r} must match [a-z][a-z0-9_]*")

    @property
    def applied_name(self) -> str:
        """The table of applied effect keys, ``<service>_applied_commands``."""
        return f"{self.service}_applied_commands"

    @property
    def offsets_name(self) -> str:
        """The table of stored offsets, ``<service>_kafka_offsets``."""
        return f"{self.service}_kafka_offsets"

    def _identifier(self, name: str) -> sql.Identifier:
        parts = (self.schema, name) if self.schema else (name,)
        result: sql.Identifier = _sql().Identifier(*parts)
        return result

    def schema_sql(self) -> list[sql.Composed]:
        """The statements that create both tables (idempotent)."""
        text = _sql().SQL
        return [
            text(
                "CREATE TABLE IF NOT EXISTS {} ("
                " effect_key text PRIMARY KEY,"
                " command text NOT NULL,"
                " idempotency_key text NOT NULL,"
                " source text NOT NULL,"
                " event_type text,"
                " received_at bigint NOT NULL,"
                " kafka_topic text,"
                " kafka_partition integer,"
                " kafka_offset bigint,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(self._identifier(self.applied_name)),
            text(
                "CREATE TABLE IF NOT EXISTS {} ("
                " kafka_topic text NOT NULL,"
                " kafka_partition integer NOT NULL,"
                " next_offset bigint NOT NULL,"
                " updated_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (kafka_topic, kafka_partition))"
            ).format(self._identifier(self.offsets_name)),
        ]

    def claim_sql(self) -> sql.Composed:
        """Claim an effect key: a row back means this transaction claimed it, none means a repeat."""
        template: sql.SQL = _sql().SQL(
            "INSERT INTO {} (effect_key, command, idempotency_key, source, event_type, received_at,"
            " kafka_topic, kafka_partition, kafka_offset, applied_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, now())"
            " ON CONFLICT (effect_key) DO NOTHING RETURNING effect_key"
        )
        return template.format(self._identifier(self.applied_name))

    def offset_sql(self) -> sql.Composed:
        """Store a partition's next offset; it only ever moves forward."""
        template: sql.SQL = _sql().SQL(
            "INSERT INTO {0} AS o (kafka_topic, kafka_partition, next_offset, updated_at)"
            " VALUES (%s, %s, %s, now()) ON CONFLICT (kafka_topic, kafka_partition) DO UPDATE"
            " SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset), updated_at = now()"
        )
        return template.format(self._identifier(self.offsets_name))

    def load_sql(self) -> sql.Composed:
        """Read every stored offset of the given topics."""
        template: sql.SQL = _sql().SQL(
            "SELECT kafka_topic, kafka_partition, next_offset FROM {} WHERE kafka_topic = ANY(%s)"
        )
        return template.format(self._identifier(self.offsets_name))


def _claim_params(command: Command) -> tuple[Any, ...]:
    origin = command.origin
    return (
        command.effect_key,
        command.command,
        command.key,
        command.source,
        command.event_type,
        command.received_at,
        origin.topic if origin else None,
        origin.partition if origin else None,
        origin.offset if origin else None,
    )


def _offset_params(command: Command) -> tuple[str, int, int]:
    origin = command.origin
    if origin is None:
        raise ConfigError(
            f"command {command.effect_key!r} has no origin (topic, partition, offset): "
            "store_offset needs a command read from Kafka (Command.from_consumer_record)"
        )
    return origin.topic, origin.partition, origin.next_offset


def ensure_schema(conn: psycopg.Connection[Any], *, service: str, schema: str | None = None) -> None:
    """Create the service's tables if they do not exist (committed on return).

    ``<service>_applied_commands`` has one row per effect key applied. Rows may
    be deleted once they are older than the longest replay you must survive
    (the command topic's retention, a provider's manual replay window); a
    command replayed after that is applied again, so keep effects idempotent too.
    """
    statements = ServiceTables(service, schema).schema_sql()
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)


async def ensure_schema_async(
    conn: psycopg.AsyncConnection[Any], *, service: str, schema: str | None = None
) -> None:
    """:func:`ensure_schema` for an async connection."""
    statements = ServiceTables(service, schema).schema_sql()
    async with conn.transaction():
        for statement in statements:
            await conn.execute(statement)


def apply_once(
    conn: psycopg.Connection[Any],
    command: Command,
    apply: SyncApply,
    *,
    service: str,
    schema: str | None = None,
    store_offset: bool = False,
) -> bool:
    """Apply ``command`` at most once per effect key for ``service``; True if applied now, False on a repeat.

    In one database transaction: claim the effect key in
    ``<service>_applied_commands`` (``INSERT … ON CONFLICT (effect_key) DO
    NOTHING RETURNING``); only if the row is new, run ``apply(cursor, command)``
    on the same cursor; with ``store_offset``, move ``<service>_kafka_offsets``
    past the command (repeats too); commit. If ``apply`` raises, everything
    rolls back, the claim with it, and the exception propagates: a later
    delivery applies it again.

    The claim and the effect share one transaction, so they become durable
    together or not at all: a crash between two separate commits would either
    lose the effect (claim first) or apply it twice (effect first). Two
    consumers racing on one effect key are serialised by the primary key: the
    second INSERT waits for the first transaction, then inserts nothing (or
    claims the key if the first rolled back). Only writes made through
    ``cursor`` (this database) are covered; an HTTP call from ``apply`` is not.

    On an idle connection the transaction is committed before this returns, so
    the Kafka offset may be committed after it. Inside a caller's
    ``with conn.transaction():`` it is a savepoint committed with that block.
    """
    tables = ServiceTables(service, schema)
    claim = tables.claim_sql()
    offset = (tables.offset_sql(), _offset_params(command)) if store_offset else None
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute(claim, _claim_params(command))
        fresh = cursor.fetchone() is not None
        if fresh:
            apply(cursor, command)
        if offset is not None:
            cursor.execute(*offset)
    return fresh


async def apply_once_async(
    conn: psycopg.AsyncConnection[Any],
    command: Command,
    apply: AsyncApply,
    *,
    service: str,
    schema: str | None = None,
    store_offset: bool = False,
) -> bool:
    """:func:`apply_once` for ``psycopg.AsyncConnection``; ``apply`` is a coroutine function."""
    tables = ServiceTables(service, schema)
    claim = tables.claim_sql()
    offset = (tables.offset_sql(), _offset_params(command)) if store_offset else None
    async with conn.transaction(), conn.cursor() as cursor:
        await cursor.execute(claim, _claim_params(command))
        fresh = await cursor.fetchone() is not None
        if fresh:
            await apply(cursor, command)
        if offset is not None:
            await cursor.execute(*offset)
    return fresh


async def store_offset_async(
    conn: psycopg.AsyncConnection[Any], command: Command, *, service: str, schema: str | None = None
) -> None:
    """Move the stored offset past a command the service does not apply (no claim), in its own transaction."""
    tables = ServiceTables(service, schema)
    params = _offset_params(command)
    async with conn.transaction():
        await conn.execute(tables.offset_sql(), params)


async def load_offsets_async(
    conn: psycopg.AsyncConnection[Any],
    partitions: Collection[tuple[str, int]],
    *,
    service: str,
    schema: str | None = None,
) -> dict[tuple[str, int], int]:
    """The stored next offset of each of ``partitions`` (``(topic, partition)``) that has one."""
    tables = ServiceTables(service, schema)
    wanted = set(partitions)
    async with conn.transaction():
        cursor = await conn.execute(tables.load_sql(), (sorted({t for t, _ in wanted}),))
        rows = await cursor.fetchall()
    return {(str(t), int(p)): int(o) for t, p, o in rows if (t, p) in wanted}


class PostgresOffsets:
    """Offsets kept in the service's database, for ``CommandStream(offsets=PostgresOffsets(...))``.

    On every assignment the stream asks :meth:`load` for the stored offsets and
    seeks there; partitions without one start at the group's committed offset
    (earliest for a new group). Each load opens a short connection of its own,
    so it never runs inside the service's open transaction. Pair it with
    ``apply_once_async(..., store_offset=True)`` (and :func:`store_offset_async`
    for skipped commands), which move the offset in the effect's transaction.
    """

    def __init__(self, dsn: str, *, service: str, schema: str | None = None) -> None:
        self.tables = ServiceTables(service, schema)
        self.dsn = dsn

    async def load(self, partitions: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The stored next offset of each partition that has one."""
        _sql()  # the one-line missing-extra error, before psycopg is imported below
        import psycopg  # noqa: PLC0415

        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            await ensure_schema_async(conn, service=self.tables.service, schema=self.tables.schema)
            return await load_offsets_async(
                conn, partitions, service=self.tables.service, schema=self.tables.schema
            )
