"""An aiokafka dedupe consumer that claims keys in Redis or PostgreSQL (the hand-rolled alternative).

    python bench/alternatives/claim.py --store redis --url redis://127.0.0.1:PORT/0 \
        --bootstrap B --input T --output U --group G
    python bench/alternatives/claim.py --store pg --url postgresql://postgres@127.0.0.1:PORT/pipeline ...

The shape most teams write first: a group consumer with manual commits reads a
batch (``getmany``), claims every key of the batch in one round trip - Redis
``SET key 1 NX EX ttl`` in a pipeline, or PostgreSQL ``INSERT ... ON CONFLICT
DO NOTHING RETURNING key`` - produces a command for each record whose claim
succeeded, waits for the broker's acks and only then commits the batch's
offsets. At least once on the Kafka side; the claim store turns redeliveries
into no-ops. Runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.alternatives
from bench.alternatives.common import command

log = logging.getLogger("claim")


class RedisClaims:
    def __init__(self, url: str, ttl: int) -> None:
        self.client = aioredis.from_url(url)
        self.ttl = ttl

    async def start(self) -> None:
        await self.client.ping()

    async def claim(self, keys: list[bytes]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, b"1", nx=True, ex=self.ttl)
        return [bool(r) for r in await pipe.execute()]

    async def stop(self) -> None:
        await self.client.aclose()


class PostgresClaims:
    def __init__(self, url: str, ttl: int) -> None:
        self.url = url
        self.ttl = ttl
        self.conn: Any = None

    async def start(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await self.conn.execute(
            "CREATE TABLE IF NOT EXISTS seen (key text PRIMARY KEY, expires_at timestamptz NOT NULL)"
        )

    async def claim(self, keys: list[bytes]) -> list[bool]:
        texts = [k.decode() for k in keys]
        cursor = await self.conn.execute(
            "INSERT INTO seen (key, expires_at) SELECT k, now() + make_interval(secs => %s) "
            "FROM unnest(%s::text[]) AS k ON CONFLICT (key) DO NOTHING RETURNING key",
            (self.ttl, texts),
        )
        won = {row[0] for row in await cursor.fetchall()}
        result = []
        for text in texts:  # a key repeated within the batch wins once, at its first copy
            result.append(text in won)
            won.discard(text)
        return result

    async def stop(self) -> None:
        if self.conn is not None:
            await self.conn.close()


async def run(args: argparse.Namespace) -> None:
    claims: Any = (
        RedisClaims(args.url, args.ttl) if args.store == "redis" else PostgresClaims(args.url, args.ttl)
    )
    consumer = AIOKafkaConsumer(
        args.input,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_poll_records=args.max_records,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=2_000,
        client_id=f"claim-{args.store}",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=512 * 1024,
        client_id=f"claim-{args.store}",
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await claims.start()
    await producer.start()
    await consumer.start()
    handled = 0
    log.info("claim-%s started: %s -> %s, group %s", args.store, args.input, args.output, args.group)
    try:
        while not stopping.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=args.max_records)
            if not batches:
                continue
            records = [r for rs in batches.values() for r in rs]
            won = await claims.claim([r.key for r in records])
            futures = [
                await producer.send(args.output, command(r.key, r.value, r.headers), key=r.key)
                for r, first in zip(records, won, strict=True)
                if first
            ]
            await asyncio.gather(*futures)  # acked before the offsets move
            await consumer.commit({tp: rs[-1].offset + 1 for tp, rs in batches.items()})
            handled += len(records)
    finally:
        await consumer.stop()
        await producer.stop()
        await claims.stop()
        log.info("claim-%s stopped after %s records", args.store, handled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("redis", "pg"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--ttl", type=int, default=7 * 86400, help="seconds a claim lives")
    parser.add_argument("--max-records", type=int, default=2000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
