"""Per-partition gauges: consumer lag, store keys and bytes, set as the loop goes and removed on release."""

from __future__ import annotations

import contextlib
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.partition import Partition

DISK_MEASURE_EVERY = 10.0  # seconds between walks of a store's files


def observe_lag(metrics: WorkerMetrics, consumer: AIOKafkaConsumer, part: Partition) -> None:
    """Records between the partition's transaction and the end of its log."""
    txn = part.txn
    highwater = consumer.highwater(part.tp)
    if highwater is not None and txn is not None and txn.next_offset is not None:
        metrics.lag.labels(part.tp.topic, str(part.tp.partition)).set(max(highwater - txn.next_offset, 0))


def observe_store(metrics: WorkerMetrics, part: Partition, measured_at: float) -> float:
    """The store's key estimate, and its bytes on disk at most every :data:`DISK_MEASURE_EVERY`
    seconds after ``measured_at``; returns when the disk was last measured."""
    store = part.store
    if store is None:
        return measured_at
    labels = (part.tp.topic, str(part.tp.partition))
    metrics.store_keys.labels(*labels).set(store.key_count())
    now = time.monotonic()
    if now - measured_at > DISK_MEASURE_EVERY:
        metrics.store_bytes.labels(*labels).set(store.disk_bytes())
        return now
    return measured_at


def forget_partition(metrics: WorkerMetrics, tp: TopicPartition) -> None:
    """Stop reporting a partition this worker no longer owns."""
    for gauge, labels in (
        (metrics.lag, (tp.topic, str(tp.partition))),
        (metrics.restore_remaining, (tp.topic, str(tp.partition))),
        (metrics.store_keys, (tp.topic, str(tp.partition))),
        (metrics.store_bytes, (tp.topic, str(tp.partition))),
    ):
        with contextlib.suppress(KeyError):  # never reported
            gauge.remove(*labels)
