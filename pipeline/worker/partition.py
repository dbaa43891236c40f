"""One owned input partition: its store, transactional producer, checkpoint and processor.

:func:`open_partition` builds it in the order exactly-once needs: the store
(wiped when unreadable, waited for while a previous owner in this state
directory still holds its lock), a producer whose ``transactional_id`` is
derived from the partition (starting it fences any older owner and aborts
that owner's open transaction), then a restore from the changelog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from pipeline.config import WorkerSettings
from pipeline.errors import StoreCorruptError, StoreError
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.state.store import PartitionStore, bucket_width
from pipeline.state.transaction import PartitionCheckpoint
from pipeline.topology import Topology
from pipeline.worker.classify import Classifier
from pipeline.worker.effect_stage import EffectProcessor
from pipeline.worker.event_stage import OutputTopics, PartitionProcessor
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.restore import restore

log = logging.getLogger(__name__)

STORE_LOCK_WAIT = 30.0


@dataclass
class Partition:
    """An input partition this worker owns, and the loop's bookkeeping for it."""

    tp: TopicPartition
    store: PartitionStore
    producer: AIOKafkaProducer
    checkpoint: PartitionCheckpoint
    processor: PartitionProcessor | EffectProcessor
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    committing: bool = False
    paused: bool = False  # by the loop, because records piled up during a commit
    pending: list[Any] = field(default_factory=list)  # fetched during a commit, handled after it
    seeks: int = 0  # times the loop moved this partition's position back: records fetched before are stale
    disk_measured_at: float = 0.0

    async def release(self) -> None:
        """Stop the producer and close the store; the transaction is already committed or aborted."""
        try:
            await self.producer.stop()
        except (KafkaError, IllegalOperation, AssertionError) as exc:  # a producer that went fatal
            log.warning("%s: producer did not stop cleanly: %r", self.tp, exc)
        self.store.close()


async def open_partition(
    tp: TopicPartition,
    *,
    changelog: TopicPartition,
    settings: WorkerSettings,
    topology: Topology,
    classifier: Classifier,
    outputs: OutputTopics,
    metrics: WorkerMetrics,
) -> Partition:
    """Open ``tp``'s store, fence older owners with its producer, and restore the store from ``changelog``."""
    path = Path(settings.state_dir) / f"{tp.topic}-{tp.partition}"
    store = await _open_store(path, bucket_ms=bucket_width(int(topology.max_ttl.total_seconds() * 1000)))
    txn_id = f"{topology.app}-{settings.group}-{tp.topic}-{tp.partition}"
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        transactional_id=txn_id,
        acks="all",
        enable_idempotence=True,
        max_batch_size=MAX_MESSAGE_BYTES,
        max_request_size=MAX_MESSAGE_BYTES,
        linger_ms=5,
        client_id=txn_id,
    )
    try:
        await producer.start()  # InitProducerId: fences the previous owner, aborts its open transaction
        applied = await restore(
            store,
            changelog,
            bootstrap=settings.bootstrap,
            progress_every=settings.restore_progress_every,
        )
    except BaseException:
        await producer.stop()
        store.close()
        raise
    metrics.restore_records.inc(applied)
    checkpoint = PartitionCheckpoint(
        tp=tp, group=settings.group, producer=producer, store=store, changelog=changelog
    )
    processor: PartitionProcessor | EffectProcessor
    if tp.topic == topology.topics.input:
        processor = PartitionProcessor(
            tp=tp,
            topology=topology,
            classifier=classifier,
            checkpoint=checkpoint,
            outputs=outputs,
            recorder=metrics,
        )
    else:
        processor = EffectProcessor(
            tp=tp, topology=topology, checkpoint=checkpoint, outputs=outputs, recorder=metrics
        )
    return Partition(tp, store, producer, checkpoint, processor)


async def _open_store(path: Path, *, bucket_ms: int) -> PartitionStore:
    deadline = time.monotonic() + STORE_LOCK_WAIT
    while True:
        try:
            return PartitionStore.open(path, bucket_ms=bucket_ms)
        except StoreCorruptError as exc:
            log.warning("%s; wiping it and restoring from the changelog", exc)
            PartitionStore.wipe(path)
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
