"""A faust-streaming app consuming a command topic with a typed Record, read_committed.

Each command it sees is written as one JSON line (effect key, command,
partition, offset) to ``--out``; it stops after ``--expect`` commands or after
``--max-idle`` seconds without a new one.

    python examples/faust_consumer.py --broker 127.0.0.1:19092 --topic webhooks.events \\
        --out seen.jsonl --expect 10

read_committed: faust-streaming has no setting for the consumer's isolation
level. Its aiokafka driver uses ``read_committed`` only when
``processing_guarantee="exactly_once"``, which also turns on its transactional
producer machinery (the part ``docs/design.md`` section 4, decision 1,
avoids). This app keeps at-least-once processing and swaps in a transport
whose consumer is created with ``isolation_level="read_committed"``
(``ReadCommittedTransport``). Without it, the app would also receive the
commands of aborted transactions.
Delivery stays at least once either way: make the effects idempotent (see
``postgres_orders.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faust
import orjson
from faust.transport.drivers import aiokafka as faust_aiokafka


class CommandRecord(faust.Record, serializer="json", validation=True):
    """The contract's command (``docs/design.md``, section 3), as a faust Record; field types are checked."""

    command: str
    key: str
    effect_key: str
    source: str
    event_type: str | None
    received_at: int
    event: dict[str, Any]


class SkipUndecodableTopic(faust.Topic):
    """A topic whose undecodable records are reported and skipped instead of crashing the agent.

    faust acks a record it cannot decode and then re-raises the error inside
    the agent, which kills the agent: every later command would sit unprocessed.
    """

    async def on_key_decode_error(self, exc: Exception, message: Any) -> None:
        await self._report(exc, message)

    async def on_value_decode_error(self, exc: Exception, message: Any) -> None:
        await self._report(exc, message)

    async def _report(self, exc: Exception, message: Any) -> None:
        # a real service would send the record to its own dead-letter topic here
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        print(f"faust_consumer: skipping undecodable command {where}: {exc}", file=sys.stderr)


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's aiokafka consumer thread, but its consumer reads only committed records."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes isolation_level="read_uncommitted" unless exactly_once is on; the
        # aiokafka consumer is not started yet and hands this value to its fetcher at start().
        if getattr(consumer, "_isolation_level", None) is None:
            raise RuntimeError("this aiokafka version has no _isolation_level: cannot force read_committed")
        consumer._isolation_level = "read_committed"
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer using :class:`ReadCommittedConsumerThread`."""

    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    """The aiokafka transport with a read_committed consumer."""

    Consumer = ReadCommittedConsumer


class ReadCommittedApp(faust.App):
    """A faust App whose consumer transport is :class:`ReadCommittedTransport`."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--topic", default=os.environ.get("PIPELINE_COMMAND_TOPIC", "webhooks.events"))
    parser.add_argument("--group", default=None, help="consumer group (default: a new one per run)")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines file, one per command seen")
    parser.add_argument("--expect", type=int, default=0, help="stop after this many commands (0: no limit)")
    parser.add_argument("--max-idle", type=float, default=10.0, help="stop after this many idle seconds")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="faust's data directory (default: a temp dir)"
    )
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace) -> tuple[faust.App, dict[str, Any]]:
    """The faust app with its agent, and a timer that stops ``state["worker"]`` when done."""
    group = args.group or f"faust-example-{os.getpid()}-{int(time.time())}"
    app = ReadCommittedApp(
        group,
        broker=f"kafka://{args.broker}",
        consumer_auto_offset_reset="earliest",
        datadir=str(args.data_dir),
        web_enabled=False,
        topic_disable_leader=True,  # no <app>-__assignor-__leader topic for a plain consumer
        topic_allow_declare=False,  # the command topic belongs to the pipeline: never create it
    )
    topic = SkipUndecodableTopic(app, topics=[args.topic], key_type=bytes, value_type=CommandRecord)
    state: dict[str, Any] = {"seen": 0, "last": time.monotonic(), "stopping": None, "worker": None}
    out = state["out"] = args.out.open("ab")

    @app.agent(topic)
    async def record_commands(stream: Any) -> None:
        async for event in stream.events():
            command: CommandRecord = event.value
            line = {
                "effect_key": command.effect_key,
                "command": command.command,
                "key": command.key,
                "event_type": command.event_type,
                "partition": event.message.partition,
                "offset": event.message.offset,
            }
            out.write(orjson.dumps(line) + b"\n")
            out.flush()
            state["seen"] += 1
            state["last"] = time.monotonic()

    @app.timer(0.2)  # type: ignore[untyped-decorator]
    async def stop_when_done() -> None:
        done = args.expect and state["seen"] >= args.expect
        idle = time.monotonic() - state["last"] > args.max_idle
        if (done or idle) and state["stopping"] is None:
            why = "expected count reached" if done else "idle"
            print(f"faust_consumer: stopping ({why}) after {state['seen']} commands", file=sys.stderr)
            # stop from a task of its own: stopping cancels this timer's task.
            state["stopping"] = asyncio.ensure_future(state["worker"].stop())

    return app, state


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="faust-example.") as tmp:
        if args.data_dir is None:
            args.data_dir = Path(tmp)
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the worker until it stops itself; print a JSON summary line."""
    app, state = build_app(args)
    # the worker's spinner and logs go to stderr; stdout carries only the final summary line
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, stdout=sys.stderr, redirect_stdouts=False)
    state["worker"] = worker
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        state["out"].close()
    print(orjson.dumps({"seen": state["seen"]}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
