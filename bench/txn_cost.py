"""What one Kafka transaction costs aiokafka, apart from the worker.

    .venv/bin/python bench/txn_cost.py --bootstrap 127.0.0.1:19092 --transactions 300

A transactional producer runs ``begin_transaction``, ``send`` one 500-byte record to each
of N fresh topics, optionally ``send_offsets_to_transaction``, ``commit_transaction``, in a
loop, one transaction after another. Printed per shape: CPU per transaction (user and
system, from ``getrusage``) and wall time per transaction. The worker's caught-up commits
are the "3 topics + offsets" shape (command, audit and changelog records, and the input
offsets), so this is the floor of what each of them costs, whatever the worker does
around it. aiokafka's wait before asking again while the previous transaction's markers
are written is set as the worker sets it. The topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import time
import uuid

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.producer import sender as aiokafka_sender

from pipeline.worker.clients import CONCURRENT_TXN_RETRY_S

WARM_UP = 30
SHAPES = ((1, False), (3, True))


async def measure(bootstrap: str, topics: list[str], *, offsets: bool, transactions: int) -> dict[str, float]:
    """Run ``transactions`` transactions of one record per topic; their CPU and wall time each."""
    tag = uuid.uuid4().hex[:8]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"txn-cost-{tag}", enable_idempotence=True
    )
    await producer.start()
    try:
        before = after = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        for i in range(WARM_UP + transactions):
            if i == WARM_UP:
                before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            async with producer.transaction():
                sent = [await producer.send(topic, b"v" * 500, key=b"k") for topic in topics]
                await asyncio.gather(*sent)  # the worker, too, sends the offsets after the acks
                if offsets:
                    await producer.send_offsets_to_transaction(
                        {TopicPartition(topics[0], 0): i}, f"txn-cost-{tag}"
                    )
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        await producer.stop()
    return {
        "user": (after.ru_utime - before.ru_utime) / transactions * 1e6,
        "system": (after.ru_stime - before.ru_stime) / transactions * 1e6,
        "wall": wall / transactions * 1e3,
    }


async def ready(bootstrap: str, topics: list[str]) -> None:
    """Wait until every new topic takes a record: a topic just made refuses its first ones a while."""
    logging.getLogger("aiokafka").setLevel(logging.ERROR)  # those refusals are retried, and expected
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, b"ready") for topic in topics])
    finally:
        await producer.stop()
        logging.getLogger("aiokafka").setLevel(logging.NOTSET)


async def main(bootstrap: str, transactions: int) -> None:
    aiokafka_sender.BACKOFF_OVERRIDE = CONCURRENT_TXN_RETRY_S  # as the worker's producers have it
    tag = uuid.uuid4().hex[:8]
    topics = [f"txn-cost-{tag}-{i}" for i in range(max(n for n, _ in SHAPES))]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1) for topic in topics])
        await ready(bootstrap, topics)
        print(f"{transactions} transactions per shape, one 500-byte record per topic; {os.cpu_count()} CPUs")
        print("| shape | CPU µs/txn | user | system | wall ms/txn |")
        print("|---|---:|---:|---:|---:|")
        for count, offsets in SHAPES:
            cost = await measure(bootstrap, topics[:count], offsets=offsets, transactions=transactions)
            shape = f"{count} topic{'s' if count > 1 else ''}{' + offsets' if offsets else ''}"
            print(
                f"| {shape} | {cost['user'] + cost['system']:.0f} | {cost['user']:.0f} | "
                f"{cost['system']:.0f} | {cost['wall']:.2f} |"
            )
    finally:
        await admin.delete_topics(topics)
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--transactions", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.bootstrap, args.transactions))
