"""The topic configs a worker refuses to start on, checked again while it runs.

At start the worker refuses a changelog deleted sooner than its claims live or deleted by size,
a compacted audit or DLQ topic, and a missing topic (:mod:`pipeline.kafka.topic_checks`). Those
configs can change under a running worker (``kafka-configs.sh``, a retention policy applied to a
whole cluster): the broker then deletes claims still live within minutes, a store rebuilt from the
changelog afterwards takes their keys' next copies for first, and the next worker to start (a
restart, a failover) refuses to. Nothing the running worker does keeps what the broker deletes, and
the records it handles now are still decided right, so it goes on serving; it says so at once, and
keeps saying it until the config is fixed: one error line naming the topic and the fix, the
``warnings`` of ``/healthz`` (which stays ready), and the gauge ``pipeline_topic_config_refused``
at 1 (0 again once fixed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError
from prometheus_client import Gauge

from pipeline.cancelling import cancel_and_wait
from pipeline.errors import ConfigError, PipelineError

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0  # one reading of the topics' configs


class TopicWatch:
    """Reads the topics' configs every ``interval`` seconds (``read`` raises :class:`ConfigError` for one
    the worker refuses) and reports a refusal as it comes and goes."""

    def __init__(self, read: Callable[[], Awaitable[object]], gauge: Gauge, *, interval: float) -> None:
        self._read = read
        self._gauge = gauge
        self._interval = interval
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.refused: str | None = None  # the refusal standing now, as the error says it

    def start(self) -> None:
        """Check every ``interval`` seconds from now on, in the background (a timer until the first: nothing
        runs before it)."""
        if not self._closed and self._timer is None and self._task is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._due)

    async def close(self) -> None:
        """Stop checking (the worker stops)."""
        self._closed = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def warnings(self) -> list[str]:
        """What ``/healthz`` shows under ``warnings``: the refusal standing now, if any."""
        if self.refused is None:
            return []
        return [f"{self.refused} (a worker started now would refuse to start)"]

    async def check(self) -> None:
        """One reading: a new refusal is logged as an error, a fixed one as fixed; a reading that fails
        (the broker away) leaves what was known."""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                await self._read()
        except ConfigError as exc:
            self._stands(str(exc))
        except (PipelineError, KafkaError, OSError, TimeoutError) as exc:
            log.warning(
                "cannot read the topics' configs again (%s); checking again in %ss", exc, self._interval
            )
        except Exception:  # any other is a bug: logged whole; a report never stops the worker's serving
            log.exception(
                "unexpected error reading the topics' configs; checking again in %ss", self._interval
            )
        else:
            if self.refused is not None:
                log.info("the topics' configs are fixed: %s no longer stands", self.refused)
            self.refused = None
            self._gauge.set(0)

    def _stands(self, refused: str) -> None:
        if refused != self.refused:
            log.error(
                "%s; this worker goes on serving, but a worker started now would refuse to start", refused
            )
        self.refused = refused
        self._gauge.set(1)

    def _due(self) -> None:
        self._timer = None
        self._task = asyncio.create_task(self._check_and_rearm(), name="topic watch")

    async def _check_and_rearm(self) -> None:
        await self.check()
        self._task = None
        self.start()
