"""The faust-streaming alternative: an agent deduping against a RocksDB-backed Table.

    FAUST_BENCH_BOOTSTRAP=B FAUST_BENCH_INPUT=T FAUST_BENCH_OUTPUT=U FAUST_BENCH_APP=G \
    FAUST_BENCH_DATADIR=D FAUST_BENCH_GUARANTEE=exactly_once|at_least_once \
    FAUST_BENCH_PARTITIONS=4 FAUST_BENCH_COMMIT_S=0.1 \
        python bench/alternatives/faust_app.py worker -l info --without-web

Written the way faust's documentation shows a stateful agent: ``app.Table``
with the default ``store="rocksdb://"`` (the rocksdict driver: python-rocksdb
is not installed), co-partitioned with the input topic (the table's changelog
partition is the current event's partition), ``async for key, value in
stream.items()``, ``if key in table``, ``table[key] = ...``,
``await topic.send(...)``. The processing guarantee is an app setting. The
table is keyed by the idempotency key and remembers it (no windowing: faust's
windowed-table expiry is wall-clock based, see ``docs/design.md``, section 4,
decision 1, so a TTL is left out here, which only makes faust's job easier).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import faust

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.alternatives
from bench.alternatives.common import command

ENV = os.environ
PARTITIONS = int(ENV.get("FAUST_BENCH_PARTITIONS", "4"))

app = faust.App(
    ENV.get("FAUST_BENCH_APP", "faust-dedupe"),
    broker=f"kafka://{ENV.get('FAUST_BENCH_BOOTSTRAP', '127.0.0.1:9092')}",
    store="rocksdb://",
    datadir=ENV.get("FAUST_BENCH_DATADIR", "faust-data"),
    processing_guarantee=ENV.get("FAUST_BENCH_GUARANTEE", "at_least_once"),
    topic_partitions=PARTITIONS,
    broker_commit_interval=float(ENV.get("FAUST_BENCH_COMMIT_S", "2.8")),
    broker_session_timeout=10.0,
    broker_heartbeat_interval=2.0,
    consumer_auto_offset_reset="earliest",
    web_enabled=False,
)

raw = app.topic(
    ENV.get("FAUST_BENCH_INPUT", "webhooks.raw"),
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
commands = app.topic(
    ENV.get("FAUST_BENCH_OUTPUT", "webhooks.events"),
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
seen = app.Table("seen", default=None, key_type=bytes, value_type=bytes, partitions=PARTITIONS)


@app.agent(raw)
async def dedupe(stream: faust.StreamT[bytes]) -> None:
    async for event in stream.events():
        key = event.key
        if key in seen:
            continue
        seen[key] = b"1"
        await commands.send(key=key, value=command(key, event.value, event.headers))


if __name__ == "__main__":
    app.main()
