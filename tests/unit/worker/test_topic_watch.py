"""The topic configs a worker refuses to start on, read again while it runs: reported as they come and go."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CollectorRegistry, Gauge

from pipeline.errors import BrokerUnavailableError, ConfigError
from pipeline.kafka.topic_layout import TopicLayout
from pipeline.worker import topic_watch as watch_module
from pipeline.worker.loop import Worker
from pipeline.worker.topic_watch import TopicWatch
from tests.unit.worker.test_loop import eventually

from .fakes import TOPICS, TOPOLOGY, FakeConsumer, fake_io, layout, settings

SHORT = (
    f"changelog {TOPICS.changelog} has retention.ms=3600000 (1 h), shorter than the largest TTL plus a day "
    "(8 days): run `pipeline topics create`"
)


class Readings:
    """What each reading of the topics' configs does, in turn: return, or raise the error given."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.outcomes = list(outcomes)
        self.count = 0

    async def __call__(self) -> object:
        self.count += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return object()


def _watch(readings: Readings, interval: float = 300.0) -> tuple[TopicWatch, CollectorRegistry]:
    registry = CollectorRegistry()
    gauge = Gauge("pipeline_topic_config_refused", "test", registry=registry)
    return TopicWatch(readings, gauge, interval=interval), registry


def _value(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("pipeline_topic_config_refused")


async def test_a_refusal_is_logged_once_as_an_error_shown_as_a_warning_and_gauged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A changelog's retention lowered under the worker: one error line with the refusal and what it means, the
    same refusal read again logs nothing more; /healthz's warning names it; the gauge is 1."""
    watch, gauge = _watch(Readings(ConfigError(SHORT), ConfigError(SHORT)))
    caplog.set_level(logging.INFO, logger="pipeline.worker.topic_watch")
    await watch.check()
    await watch.check()
    assert caplog.messages == [
        f"{SHORT}; this worker goes on serving, but a worker started now would refuse to start"
    ]
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert watch.refused == SHORT
    assert watch.warnings() == [f"{SHORT} (a worker started now would refuse to start)"]
    assert _value(gauge) == 1


async def test_another_refusal_is_logged_in_its_turn(caplog: pytest.LogCaptureFixture) -> None:
    """The refusal changes (retention fixed, retention.bytes set): the new one gets its own error line."""
    by_size = f"changelog {TOPICS.changelog} has retention.bytes=1000000: set it to -1"
    watch, _gauge = _watch(Readings(ConfigError(SHORT), ConfigError(by_size)))
    caplog.set_level(logging.ERROR, logger="pipeline.worker.topic_watch")
    await watch.check()
    await watch.check()
    assert [m.split(";", maxsplit=1)[0] for m in caplog.messages] == [SHORT, by_size]
    assert watch.refused == by_size


async def test_a_fixed_config_clears_the_warning_and_the_gauge(caplog: pytest.LogCaptureFixture) -> None:
    """`pipeline topics create` run after the refusal: the next reading passes, one line says it is fixed,
    the warning is gone and the gauge is 0; a reading that passes with nothing refused logs nothing."""
    watch, gauge = _watch(Readings(ConfigError(SHORT), None, None))
    await watch.check()
    caplog.set_level(logging.INFO, logger="pipeline.worker.topic_watch")
    caplog.clear()
    await watch.check()
    await watch.check()
    assert caplog.messages == [f"the topics' configs are fixed: {SHORT} no longer stands"]
    assert watch.refused is None
    assert watch.warnings() == []
    assert _value(gauge) == 0


@pytest.mark.parametrize(
    "failure",
    [KafkaConnectionError("no broker"), BrokerUnavailableError("cannot reach Kafka"), OSError("reset")],
    ids=["kafka", "broker-unavailable", "os"],
)
async def test_a_reading_that_fails_keeps_what_was_known(
    failure: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker away at the next reading: the refusal still stands (not taken for fixed), with a warning
    line saying the configs could not be read."""
    watch, gauge = _watch(Readings(ConfigError(SHORT), failure))
    await watch.check()
    caplog.set_level(logging.WARNING, logger="pipeline.worker.topic_watch")
    caplog.clear()
    await watch.check()
    assert watch.refused == SHORT
    assert _value(gauge) == 1
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith("cannot read the topics' configs again (")


async def test_a_reading_that_never_ends_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that takes the request and never answers: the reading ends at READ_TIMEOUT_S, nothing changed."""
    monkeypatch.setattr(watch_module, "READ_TIMEOUT_S", 0.0)
    never: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def hanging() -> object:
        return await never

    watch = TopicWatch(hanging, Gauge("g", "test", registry=CollectorRegistry()), interval=300.0)
    await asyncio.wait_for(watch.check(), 5)
    assert watch.refused is None


async def test_it_reads_every_interval_from_start_until_closed() -> None:
    """Started, the watch reads again and again, an interval apart; closed, it reads no more."""
    readings = Readings()
    watch, _gauge = _watch(readings, interval=0.01)
    watch.start()
    await eventually(lambda: readings.count >= 3, what="three readings")
    await watch.close()
    count = readings.count
    await asyncio.sleep(0.05)
    assert readings.count == count


async def test_a_running_worker_warns_on_its_healthz_when_a_changelogs_retention_is_lowered(
    tmp_path: Path,
) -> None:
    """The layout refused after the start (the changelog's retention lowered under the worker): the worker
    keeps serving, ready, with the refusal under ``warnings`` and the gauge at 1."""
    io, _clients = fake_io(consumer=FakeConsumer(assign=set()))
    first = layout()
    calls: list[int] = []

    async def lowered(_bootstrap: str, _topology: Any) -> TopicLayout:
        calls.append(1)
        if len(calls) > 1:
            raise ConfigError(SHORT)
        return first

    worker = Worker(
        settings(tmp_path, topic_check_interval=0.01), TOPOLOGY, io=dataclasses.replace(io, layout=lowered)
    )
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: "warnings" in worker.health()[1], what="the warning on /healthz")
        health = worker.health()
        assert health.ready
        assert health.live
        assert health.detail["status"] == "ok"
        assert health.detail["warnings"] == [f"{SHORT} (a worker started now would refuse to start)"]
        assert worker.metrics.registry.get_sample_value("pipeline_topic_config_refused") == 1
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


async def test_a_reading_that_raises_what_nobody_expects_is_logged_whole_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in a reading is logged with its traceback and leaves what was known; the next interval reads
    again: the watch reports, it never stops the worker, and it does not go quiet."""
    readings = Readings(RuntimeError("a bug in the reading"), ConfigError(SHORT))
    watch, gauge = _watch(readings, interval=0.01)
    watch.start()
    try:
        await eventually(lambda: watch.refused == SHORT, what="the reading after the bug")
    finally:
        await watch.close()
    bug = [r for r in caplog.records if "unexpected error reading the topics' configs" in r.getMessage()]
    assert len(bug) == 1
    assert bug[0].exc_info is not None
    assert _value(gauge) == 1
