"""The ceiling for the worker benchmark: a plain aiokafka consume -> produce passthrough.

No state, no dedupe, no transactions: a group consumer reads the input topic,
every record is produced to the output topic with ``producer.send`` (key,
value and headers unchanged), and offsets are committed at least once: only
after every record sent before the commit has been acknowledged. This is the
manual-commit batch pattern of aiokafka's consumer docs (``getmany`` + manual
``commit``), with the commit made periodic instead of per batch.

    python bench/passthrough.py --bootstrap 127.0.0.1:9092 --input T --output U --group G

It runs until SIGTERM or SIGINT, then flushes, commits and leaves the group.
``bench/worker_bench.py`` starts it as a subprocess so that its RSS and CPU
can be measured on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

log = logging.getLogger("passthrough")


class Passthrough:
    """Consume, produce each record, commit periodically after the sends are acknowledged."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = asyncio.Event()
        self.pending: list[asyncio.Future[Any]] = []
        self.offsets: dict[TopicPartition, int] = {}
        self.handled = 0
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=args.max_records,
            client_id=f"passthrough-{args.group}",
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=args.bootstrap,
            acks="all",
            linger_ms=args.linger_ms,
            max_batch_size=args.max_batch_bytes,
            client_id=f"passthrough-{args.group}",
        )

    async def commit(self) -> None:
        """Wait for every send so far, then commit the offsets they came from."""
        if self.pending:
            pending, self.pending = self.pending, []
            await asyncio.gather(*pending)  # raises if a send failed: nothing is committed then
        if self.offsets:
            offsets, self.offsets = self.offsets, {}
            await self.consumer.commit(offsets)

    async def run(self) -> None:
        args = self.args
        await self.producer.start()
        await self.consumer.start()
        self.consumer.subscribe([args.input], listener=_CommitOnRevoke(self))
        log.info("passthrough started: %s -> %s, group %s", args.input, args.output, args.group)
        interval = args.commit_interval_ms / 1000
        last_commit = time.monotonic()
        try:
            while not self.stopping.is_set():
                batches = await self.consumer.getmany(timeout_ms=100, max_records=args.max_records)
                for tp, records in batches.items():
                    for record in records:
                        future = await self.producer.send(
                            args.output, record.value, key=record.key, headers=list(record.headers)
                        )
                        self.pending.append(future)
                    self.offsets[tp] = records[-1].offset + 1
                    self.handled += len(records)
                if time.monotonic() - last_commit >= interval:
                    await self.commit()
                    last_commit = time.monotonic()
        finally:
            try:
                await self.commit()
            finally:
                await self.consumer.stop()
                await self.producer.stop()
                log.info("passthrough stopped after %s records", self.handled)


class _CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """As the docs advise for manual commit: commit what is done before giving partitions up."""

    def __init__(self, app: Passthrough) -> None:
        self.app = app

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        log.info("partitions revoked: %s", sorted(tp.partition for tp in revoked))
        await self.app.commit()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("partitions assigned: %s", sorted(tp.partition for tp in assigned))


async def _main(args: argparse.Namespace) -> None:
    app = Passthrough(args)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.stopping.set)
    await app.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--max-records", type=int, default=2000)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--max-batch-bytes", type=int, default=512 * 1024)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
