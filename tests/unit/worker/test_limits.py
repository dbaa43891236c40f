"""Reading the output topics' limits again after a refusal for size: changes taken, an outage survived."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pipeline.kafka.topic_layout import RefusedConfigError, TopicLayout
from pipeline.worker import limits as limits_module
from pipeline.worker.limits import TopicLimits

from .fakes import MIB, TOPICS, layout


async def test_a_lowered_limit_is_taken_and_only_the_changed_topic_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The DLQ's limit lowered under the worker: the shared dict takes it; the warning names that topic alone."""
    read = layout({TOPICS.dlq: str(MIB)})

    async def current() -> TopicLayout:
        return read

    limits = TopicLimits(layout().limits, current)
    shared = limits.by_topic
    caplog.set_level(logging.WARNING, logger="pipeline.worker.limits")
    await limits.reread()
    assert shared[TOPICS.dlq] == MIB
    assert shared == dict(read.limits)
    assert caplog.messages == [
        f"topic limits changed under the worker: {TOPICS.dlq} {4 * MIB} -> {MIB} bytes"
    ]


async def test_a_broker_that_never_answers_keeps_the_limits_read_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read of the layout that never ends is given up at READ_TIMEOUT_S; the limits stay as they were."""
    monkeypatch.setattr(limits_module, "READ_TIMEOUT_S", 0.0)
    never: asyncio.Future[TopicLayout] = asyncio.get_running_loop().create_future()

    async def hanging() -> TopicLayout:
        return await never

    first = layout().limits
    limits = TopicLimits(first, hanging)
    await asyncio.wait_for(limits.reread(), 5)
    assert limits.by_topic == dict(first)


async def test_a_limit_lowered_while_a_changelogs_retention_is_refused_is_still_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The changelog's retention lowered too (the topic watch reports that): the layout the refusal carries
    still gives the DLQ's new limit, with no line saying the limits could not be read."""
    read = layout({TOPICS.dlq: str(MIB)})

    async def refused() -> TopicLayout:
        raise RefusedConfigError(f"changelog {TOPICS.changelog} has retention.ms=3600000", read)

    limits = TopicLimits(layout().limits, refused)
    caplog.set_level(logging.WARNING, logger="pipeline.worker.limits")
    await limits.reread()
    assert limits.by_topic[TOPICS.dlq] == MIB
    assert caplog.messages == [
        f"topic limits changed under the worker: {TOPICS.dlq} {4 * MIB} -> {MIB} bytes"
    ]
