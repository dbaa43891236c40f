"""aiokafka's consumer inside: its stop, its isolation before start, its group coordinator, its errors."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import errors as aiokafka_errors
from aiokafka.errors import BrokerResponseError, KafkaError
from aiokafka.protocol.group import HeartbeatRequest

from pipeline.errors import PipelineError
from pipeline.kafka.requests import GroupMetadata


class FencedInstanceIdError(BrokerResponseError):  # type: ignore[misc]  # aiokafka.errors is untyped
    """FENCED_INSTANCE_ID (KIP-345), which aiokafka 0.14 does not know: another consumer joined the group
    with this one's ``group.instance.id``, and the group coordinator took it in this one's place."""

    errno = 82
    message = "FENCED_INSTANCE_ID"
    description = "another consumer with the same group.instance.id registered with a different member id"


def know_fenced_instance_id() -> None:
    """Teach aiokafka's error table FENCED_INSTANCE_ID (it answers an unknown code with ``UnknownError()``,
    which says nothing): its group coordinator then names :class:`FencedInstanceIdError` in what it raises."""
    aiokafka_errors.kafka_errors.setdefault(FencedInstanceIdError.errno, FencedInstanceIdError)


def fenced_instance(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a group consumer, is FENCED_INSTANCE_ID: aiokafka's group coordinator
    raises a :class:`KafkaError` carrying only the ``repr`` of the error the coordinator answered (a
    JoinGroup, SyncGroup or Heartbeat), so the class's name is what is left of it."""
    return isinstance(exc, FencedInstanceIdError) or (
        isinstance(exc, KafkaError) and FencedInstanceIdError.__name__ in str(exc)
    )


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop ``consumer``, even when aiokafka's fetcher raises ``CancelledError`` out of ``stop()``.

    aiokafka's ``Fetcher.close`` cancels its pending fetch tasks and awaits them; one that
    is sleeping its retry backoff after a failed fetch (the broker is away) lets that
    ``CancelledError`` out, and ``consumer.stop()`` raises it although nobody cancelled the
    caller. The consumer is closed by then; only a cancellation of the caller itself goes on.
    """
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


def read_committed_before_start(consumer: AIOKafkaConsumer) -> bool:
    """Make a consumer made by someone else (faust's driver) read committed records only; it must not be
    started yet (its fetcher takes the isolation level at start). False when aiokafka has no such field."""
    if getattr(consumer, "_isolation_level", None) is None:
        return False
    consumer._isolation_level = "read_committed"
    return True


def request_rejoin(consumer: AIOKafkaConsumer) -> None:
    """Make the group consumer rejoin its group (a new generation: every member's
    partitions are revoked and assigned again), as Kafka Streams does on a fenced task."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if coordinator is not None:
        coordinator.request_rejoin()


async def generation_current(consumer: AIOKafkaConsumer) -> bool | None:
    """Whether the group coordinator still counts ``consumer`` a member of its current generation.

    A Heartbeat with the coordinator's own generation and member id: True when it is
    answered without error; False when the member is unknown, the generation is over
    or a rebalance is under way (the consumer is then asked to rejoin); None when the
    coordinator is unknown or the request fails (nothing confirmed). A worker that was
    dropped from its group while the broker was away learns it here, before a producer
    start of its would fence the partition's new assignee.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if coordinator is None or coordinator.coordinator_id is None:
        return None
    request = HeartbeatRequest(coordinator.group_id, coordinator.generation, coordinator.member_id)
    try:
        response = await coordinator._send_req(request)
    except KafkaError:
        return None
    if response.error_code != 0:
        coordinator.request_rejoin()
        return False
    return True


def group_metadata(consumer: AIOKafkaConsumer) -> GroupMetadata:
    """The group of a started group consumer, and the generation, member id and group instance id its
    coordinator holds now. Before the consumer joined, and once the coordinator forgot its membership,
    the generation is -1 and the member id empty (:func:`send_offsets_with_group_metadata` refuses those)."""
    coordinator = _group_coordinator(consumer)
    return GroupMetadata(
        coordinator.group_id, coordinator.generation, coordinator.member_id, coordinator._group_instance_id
    )


def _group_coordinator(consumer: AIOKafkaConsumer) -> Any:
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if getattr(coordinator, "generation", None) is None:
        raise PipelineError("the consumer has no group coordinator (no group id, or not started)")
    return coordinator


async def group_request(consumer: AIOKafkaConsumer, request: Any) -> Any:
    """Send ``request`` to the consumer's group coordinator (found first, as the consumer's own requests
    are); a failure to send marks the coordinator unknown, and so does :func:`group_coordinator_moved`."""
    coordinator = _group_coordinator(consumer)
    await coordinator.ensure_coordinator_known()
    return await coordinator._send_req(request)


def group_coordinator_moved(consumer: AIOKafkaConsumer) -> None:
    """The coordinator answered that the group is not its own (or not yet): find it again."""
    _group_coordinator(consumer).coordinator_dead()
