"""A faust-streaming agent that applies commands once per effect key in PostgreSQL.

    app = read_committed_app("orders", broker="kafka://127.0.0.1:9092")
    apply_once_agent(app, ["shop.orders"], service="orders", dsn=DSN,
                     handlers={"fulfil-order": fulfil_order})

- :func:`read_committed_app`: a ``faust.App`` whose consumer reads only
  committed records. faust-streaming has no setting for the isolation level:
  its aiokafka driver uses ``read_committed`` only with
  ``processing_guarantee="exactly_once"``, which also turns on the
  transactional machinery ``docs/design.md`` (section 4, decision 1) avoids.
- :func:`command_topic`: the command topics with raw bytes keys and values,
  never declared (they belong to the pipeline); :func:`commands` turns the
  agent's stream into typed :class:`Command` s, skipping (and logging) records
  that break the contract instead of letting faust kill the agent.
- :func:`apply_once_agent`: the agent. Each command is applied with
  :func:`~pipeline.downstream.apply_once_async` in the service's own table;
  faust acknowledges an event when the agent asks for the next one, i.e.
  after the database commit, and commits acknowledged offsets to Kafka: the
  offset policy (a). Offsets kept in the database (policy b) are offered by
  :class:`~pipeline.downstream.CommandStream` only.

faust is the optional ``faust`` extra and psycopg the ``postgres`` extra; both
are imported on first use.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal

from pipeline.downstream.commands import Command, CommandRecordError, Origin
from pipeline.downstream.postgres import AsyncApply, _sql, apply_once_async, ensure_schema_async
from pipeline.errors import InvalidRecordError, MissingExtraError
from pipeline.kafka import internals

__all__ = ["Outcome", "apply_once_agent", "command_topic", "commands", "read_committed_app"]

log = logging.getLogger(__name__)

Outcome = Literal["applied", "repeat", "skipped", "invalid"]


def _faust() -> Any:
    try:
        import faust  # noqa: PLC0415
    except ImportError:
        raise MissingExtraError(
            "pipeline.downstream.faust_agent needs faust-streaming, which is not installed: "
            "pip install 'webhook-pipeline[faust]'"
        ) from None
    return faust


@functools.cache
def _app_class() -> Any:
    """``faust.App`` with a transport whose aiokafka consumer is created read_committed."""
    base_app: Any = _faust().App
    from faust.transport.drivers import aiokafka as driver  # noqa: PLC0415

    class ReadCommittedConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # not started yet: the fetcher takes the isolation level at start()
            if not internals.read_committed_before_start(consumer):
                raise MissingExtraError(
                    "this aiokafka version has no _isolation_level: cannot read faust's input read_committed"
                )
            return consumer

    class ReadCommittedConsumer(driver.Consumer):
        def _new_consumer_thread(self) -> Any:
            return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class ReadCommittedTransport(driver.Transport):
        Consumer = ReadCommittedConsumer

    class ReadCommittedApp(base_app):  # type: ignore[misc]
        def _new_transport(self) -> Any:
            return ReadCommittedTransport(self.conf.broker_consumer, self)

    return ReadCommittedApp


def read_committed_app(app_id: str, **options: Any) -> Any:
    """A ``faust.App`` reading only committed records, earliest first, declaring no topics of its own."""
    defaults: dict[str, Any] = {
        "consumer_auto_offset_reset": "earliest",
        "topic_disable_leader": True,  # no <app>-__assignor-__leader topic for a plain consumer
        "topic_allow_declare": False,  # command topics belong to the pipeline: never create them
    }
    return _app_class()(app_id, **{**defaults, **options})


def command_topic(app: Any, topics: Sequence[str]) -> Any:
    """The command topics as one faust topic of raw bytes (parsed by :func:`commands`)."""
    return app.topic(*topics, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


async def commands(stream: Any) -> AsyncIterator[Command]:
    """Typed commands from a faust stream of :func:`command_topic`; a bad record is logged and skipped."""
    async for event in stream.events():
        message = event.message
        origin = Origin(
            message.topic, message.partition, message.offset, int((message.timestamp or 0) * 1000)
        )
        try:
            value = event.value
            if not isinstance(value, bytes):
                raise CommandRecordError("value", "is missing (a tombstone)")
            yield Command.from_record(event.key, value, origin)
        except CommandRecordError as exc:
            # a real service would send the record to its own dead-letter topic here
            log.warning(
                "skipping an invalid command record %s[%s]@%s: %s",
                origin.topic,
                origin.partition,
                origin.offset,
                exc,
            )


def apply_once_agent(
    app: Any,
    topics: Sequence[str],
    *,
    service: str,
    dsn: str,
    handlers: Mapping[str, AsyncApply],
    on_outcome: Callable[[Command, Outcome], None] | None = None,
    schema: str | None = None,
) -> Any:
    """Register an agent applying each command of ``topics`` once per effect key for ``service``.

    ``handlers`` maps command names to ``async def handler(cursor, command)``,
    run inside the claim's transaction. A command without a handler is
    ``skipped`` (not claimed, so a later version can still apply it on a
    replay); a handler raising an :class:`~pipeline.errors.InvalidRecordError`
    rolls back and counts ``invalid``; any other exception rolls back and
    stops the agent, and the unacknowledged command is delivered again.
    """
    _sql()  # fail at setup, in one line, when psycopg is not installed
    topic = command_topic(app, topics)

    async def agent(stream: Any) -> None:
        import psycopg  # noqa: PLC0415

        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await ensure_schema_async(conn, service=service, schema=schema)
            async for command in commands(stream):
                outcome = await _apply(conn, command, handlers, service=service, schema=schema)
                if on_outcome is not None:
                    on_outcome(command, outcome)

    agent.__name__ = agent.__qualname__ = f"{service}_apply_once"
    return app.agent(topic, name=f"{service}-apply-once")(agent)


async def _apply(
    conn: Any, command: Command, handlers: Mapping[str, AsyncApply], *, service: str, schema: str | None
) -> Outcome:
    handler = handlers.get(command.command)
    if handler is None:
        return "skipped"
    try:
        applied = await apply_once_async(conn, command, handler, service=service, schema=schema)
    except InvalidRecordError as exc:
        log.warning("skipping command %s (%s): %s", command.effect_key, command.command, exc)
        return "invalid"
    log.info("%s %s (%s)", "applied" if applied else "repeat", command.effect_key, command.command)
    return "applied" if applied else "repeat"
