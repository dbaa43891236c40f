"""Each output topic's largest record, as the worker knows it: read at start, and read again when the broker
refuses a record as too large (a topic's ``max.message.bytes`` lowered under the running worker, seed 3276).

One dict, shared by the outputs' size check (:class:`~pipeline.worker.emitter.OutputTopics`) and the
transaction's batches (:class:`~pipeline.state.transaction.Transaction`): a new limit read here reaches both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiokafka.errors import KafkaError

from pipeline.errors import PipelineError
from pipeline.kafka.topic_layout import RefusedConfigError, TopicLayout

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0  # reading the limits again after a record was refused as too large


class TopicLimits:
    """The limits (``by_topic``, the shared dict) and how to read them again (``layout``: the worker's I/O)."""

    def __init__(self, first: Mapping[str, int], layout: Callable[[], Awaitable[TopicLayout]]) -> None:
        self.by_topic: dict[str, int] = dict(first)
        self._layout = layout

    async def reread(self) -> None:
        """Read the limits again; the broker not answering keeps those read before."""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                layout = await self._layout()
        except RefusedConfigError as exc:  # a changelog's retention lowered: the topic watch reports it
            layout = exc.layout
        except (PipelineError, KafkaError, TimeoutError) as exc:
            log.warning("cannot read the topics' limits again (%s); keeping those read before", exc)
            return
        changed = {
            topic: limit for topic, limit in layout.limits.items() if self.by_topic.get(topic) != limit
        }
        if changed:
            log.warning(
                "topic limits changed under the worker: %s",
                ", ".join(
                    f"{topic} {self.by_topic.get(topic)} -> {limit} bytes" for topic, limit in changed.items()
                ),
            )
            self.by_topic.update(changed)
