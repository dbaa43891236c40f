"""Helpers for services that consume the pipeline's command topics (``docs/downstream.md``).

The worker writes each command exactly once *into Kafka*, inside a
transaction. Delivery *out of* Kafka is at least once: a consumer that crashes
after applying a command but before its offset is stored sees the command
again, and so does a group that replays the topic. So a downstream service

1. reads typed :class:`Command` s with :class:`CommandStream` (read_committed,
   no auto-commit), and
2. applies each at most once per effect key with :func:`apply_once_async`
   (or :func:`apply_once`), which claims the effect key in the service's own
   table in the same PostgreSQL transaction as the effect, and
3. stores its offsets either in Kafka after the database commit (the stream's
   default) or in that same database transaction (:class:`PostgresOffsets`).

``pipeline.downstream.faust_agent`` does the same for a faust-streaming agent.
psycopg (``postgres`` extra) and faust (``faust`` extra) are imported on first use.
"""

from pipeline.downstream.commands import Command, CommandRecordError, Origin, consumer_settings
from pipeline.downstream.postgres import (
    PostgresOffsets,
    ServiceTables,
    apply_once,
    apply_once_async,
    ensure_schema,
    ensure_schema_async,
    load_offsets_async,
    store_offset_async,
)
from pipeline.downstream.stream import CommandStream, OffsetStore

__all__ = [
    "Command",
    "CommandRecordError",
    "CommandStream",
    "OffsetStore",
    "Origin",
    "PostgresOffsets",
    "ServiceTables",
    "apply_once",
    "apply_once_async",
    "consumer_settings",
    "ensure_schema",
    "ensure_schema_async",
    "load_offsets_async",
    "store_offset_async",
]
