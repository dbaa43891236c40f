"""Per-partition gauges: consumer lag, store keys and bytes, stream time behind the clock, set as the
loop goes and removed on release; and the warning when stream time falls behind the changelog's margin."""

from __future__ import annotations

import contextlib
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.task import ActiveTask

log = logging.getLogger(__name__)

DISK_MEASURE_EVERY = 10.0  # seconds between walks of a store's files
BEHIND_WARN_EVERY = 600.0  # seconds between two warnings about one partition's stream time


def observe_lag(metrics: WorkerMetrics, consumer: AIOKafkaConsumer, task: ActiveTask) -> None:
    """Records between the task's position and the end of its log."""
    part = task.part
    highwater = consumer.highwater(task.tp)
    if highwater is None or part is None:
        return
    handled = part.next_offset if part.next_offset is not None else task.position
    metrics.lag.labels(task.tp.topic, str(task.tp.partition)).set(max(highwater - handled, 0))


def observe_store(metrics: WorkerMetrics, part: ActiveTask, measured_at: float) -> float:
    """The store's key estimate, and its bytes on disk at most every :data:`DISK_MEASURE_EVERY`
    seconds after ``measured_at``; returns when the disk was last measured."""
    store = part.store
    if store is None:
        return measured_at
    labels = (part.tp.topic, str(part.tp.partition))
    metrics.store_keys.labels(*labels).set(store.key_count())
    if store.stream_time > 0:
        metrics.stream_time_behind.labels(*labels).set(max(time.time() - store.stream_time / 1000, 0.0))
    now = time.monotonic()
    if now - measured_at > DISK_MEASURE_EVERY:
        metrics.store_bytes.labels(*labels).set(store.disk_bytes())
        return now
    return measured_at


def warn_if_behind(part: ActiveTask, margin_ms: int, warned_at: float) -> float:
    """Warn (at most every :data:`BEHIND_WARN_EVERY` seconds) when the partition's stream time is more than
    ``margin_ms`` behind the clock; returns when it last warned.

    Changelog records are stamped when written and the broker deletes them ``retention.ms`` (the largest
    TTL plus ``margin_ms``) later. A claim written while the worker was caught up is still live, in stream
    time, when the broker deletes it only if the worker has since fallen further behind than the margin:
    a restore or a standby built then would lack it (``docs/operations.md``, Expiry and disk).
    """
    store = part.store
    if store is None or store.stream_time <= 0:
        return warned_at
    behind = int(time.time() * 1000) - store.stream_time
    now = time.monotonic()
    if behind <= margin_ms or now - warned_at < BEHIND_WARN_EVERY:
        return warned_at
    log.warning(
        "%s-%s: stream time is %.1f h behind the clock, more than the changelog's margin of %.1f h: claims "
        "written before the backlog may be deleted from the changelog while still live; raise its "
        "retention.ms by the backlog (docs/operations.md, Expiry and disk)",
        part.tp.topic,
        part.tp.partition,
        behind / 3_600_000,
        margin_ms / 3_600_000,
    )
    return now


def forget_partition(metrics: WorkerMetrics, tp: TopicPartition) -> None:
    """Stop reporting a partition this worker no longer owns."""
    for gauge, labels in (
        (metrics.lag, (tp.topic, str(tp.partition))),
        (metrics.restore_remaining, (tp.topic, str(tp.partition))),
        (metrics.store_keys, (tp.topic, str(tp.partition))),
        (metrics.store_bytes, (tp.topic, str(tp.partition))),
        (metrics.stream_time_behind, (tp.topic, str(tp.partition))),
    ):
        with contextlib.suppress(KeyError):  # never reported
            gauge.remove(*labels)
