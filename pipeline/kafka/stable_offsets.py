"""A group's committed offsets as they stand once no transaction holds them (OffsetFetch ``require_stable``).

With one transaction per worker (eos-v2), the offsets a transaction commits are pending on the
group coordinator from its TxnOffsetCommit until its markers are written. A plain OffsetFetch
(aiokafka's, v1-v3) answers the offset before that transaction meanwhile, so a new owner would
start from there and handle again what the transaction is about to commit. OffsetFetch v7 with
``require_stable`` answers such a partition UNSTABLE_OFFSET_COMMIT instead (KIP-447), and
:func:`committed_stable` asks again until the transaction has ended, either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError, UnstableOffsetsError
from pipeline.kafka import internals
from pipeline.kafka.requests import OffsetFetchRequest, read_offset_fetch

#: The longest :func:`committed_stable` waits by default: a pending transaction ends within its
#: producer's transaction timeout (60 s by default), when the transaction coordinator aborts it (it
#: looks every 10 s), and its markers follow.
STABLE_OFFSETS_TIMEOUT_S = 90.0
MAX_BACKOFF_S = 0.5


async def committed_stable(
    consumer: AIOKafkaConsumer,
    partitions: Iterable[TopicPartition],
    *,
    timeout_s: float = STABLE_OFFSETS_TIMEOUT_S,
    backoff_s: float = 0.01,
) -> dict[TopicPartition, int | None]:
    """The committed offset of each of ``partitions`` in ``consumer``'s group (None: nothing committed).

    Asked of the group coordinator with OffsetFetch v7 ``require_stable``: a partition whose offsets
    a pending transaction holds is asked for again, the wait doubling from ``backoff_s`` up to 0.5 s,
    until that transaction has committed (the answer is then its offset) or aborted (the offset before
    it). Raises :class:`UnstableOffsetsError` naming the partitions still held once ``timeout_s`` is
    over, :class:`BrokerUnavailableError` when the coordinator did not answer by then, and the
    broker's KafkaError for a refusal asking again will not change (authorization, an unknown topic).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    group = internals.group_metadata(consumer).group_id
    found: dict[TopicPartition, int | None] = {}
    wanted = sorted(set(partitions))
    while wanted:
        failure: KafkaError | TimeoutError | None = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await internals.group_request(
                    consumer, OffsetFetchRequest(group, wanted, require_stable=True)
                )
        except KafkaError as exc:
            if not exc.retriable:
                raise
            failure = exc
        except TimeoutError as exc:
            failure = exc
        else:
            answer = read_offset_fetch(response, wanted)
            if answer.coordinator_moved:
                internals.group_coordinator_moved(consumer)
            found.update(answer.committed)
            wanted = answer.again
        if not wanted:
            break
        if loop.time() + backoff_s >= deadline:
            if failure is not None:
                raise BrokerUnavailableError(
                    f"group {group}: its coordinator gave no committed offsets within {timeout_s:g} s ({failure!r})"
                )
            held = ", ".join(f"{tp.topic}-{tp.partition}" for tp in wanted)
            raise UnstableOffsetsError(
                f"group {group}: the committed offsets of {held} were still held by a pending transaction "
                f"after {timeout_s:g} s"
            )
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
    return found
