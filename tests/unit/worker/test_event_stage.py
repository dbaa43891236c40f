"""The event stage's records for what is not accepted here: reroutes, DLQ records of unusable input, and
records dated too far ahead."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pipeline.headers import RECEIVED_AT_HEADER, REPLAYED_FROM_HEADER, REROUTED_FROM_HEADER, SOURCE_HEADER
from pipeline.worker import event_stage as event_stage_module

from .fakes import INPUT, T0, TOPICS, Harness, body, keys_for, record

Opener = Callable[..., Awaitable[Harness]]
K = keys_for(0, 4)  # owned by input partition 0
ELSEWHERE = keys_for(1, 2)  # owned by input partition 1
STRIPE = [(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, str(T0).encode())]
HOSTILE = [(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, b"100000000000000000000")]


def _audit(h: Harness) -> list[dict[str, Any]]:
    return [s.json() for s in h.producer.committed_to(TOPICS.audit)]


def _events(h: Harness, source: str, outcome: str) -> float | None:
    value: float | None = h.metrics.registry.get_sample_value(
        "pipeline_events_total", {"source": source, "outcome": outcome}
    )
    return value


async def test_a_record_of_another_partition_is_moved_there_and_audited_as_rerouted(
    open_partition: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    """The copy lands on the owner partition with its origin; the audit names where it went; it counts as rerouted."""
    h = await open_partition()
    caplog.set_level(logging.INFO, logger="pipeline.worker.event_stage")
    replayed = [*STRIPE, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:3")]
    await h.handle_and_commit([record(10, ELSEWHERE[0], headers=replayed)])
    (copy,) = h.producer.committed_to(INPUT)
    assert (copy.partition, copy.key, copy.value, copy.timestamp) == (
        1,
        ELSEWHERE[0].encode(),
        body(ELSEWHERE[0]),
        T0 + 10,
    )
    assert dict(copy.headers)[REROUTED_FROM_HEADER] == b"0:10"
    assert _audit(h) == [
        {
            "key": ELSEWHERE[0],
            "outcome": "rerouted",
            "partition": 0,
            "offset": 10,
            "received_at": T0,
            "first_seen_at": None,
            "source": "stripe",
            "event_type": None,
            "expires_at": None,
            "to_partition": 1,
            "replayed_from": "webhooks.dlq:0:3",
        }
    ]
    assert h.producer.dlq() == []
    assert _events(h, "stripe", "rerouted") == 1
    assert f"{INPUT}-0 key={ELSEWHERE[0]} offset=10 rerouted to partition 1" in caplog.messages


async def test_a_rerouted_copy_too_large_for_the_input_topic_goes_to_the_dlq_instead(
    open_partition: Opener,
) -> None:
    """A copy its own topic would refuse: the record goes to the DLQ as too-large, audited invalid with its key."""
    h = await open_partition(limits={INPUT: 600})
    big = record(10, ELSEWHERE[0], value=body(ELSEWHERE[0], pad=1000))
    replayed = dataclasses.replace(big, headers=[*STRIPE, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:3")])
    await h.handle_and_commit([replayed])
    assert h.producer.committed_to(INPUT) == []
    (dlq,) = h.producer.committed_to(TOPICS.dlq)
    assert dlq.key == ELSEWHERE[0].encode()
    value = dlq.json()
    assert value["reason"] == "too-large"
    assert value["error"].startswith("its rerouted copy: a record of ")
    assert value["error"].endswith(f"larger than {INPUT} takes (600 bytes)")
    (audit,) = _audit(h)
    assert {k: audit[k] for k in ("key", "outcome", "source", "reason", "replayed_from")} == {
        "key": ELSEWHERE[0],
        "outcome": "invalid",
        "source": "stripe",
        "reason": "too-large",
        "replayed_from": "webhooks.dlq:0:3",
    }
    assert _events(h, "stripe", "invalid") == 1
    assert _events(h, "stripe", "rerouted") is None


async def test_an_unusable_replayed_record_is_audited_invalid_with_key_source_and_origin(
    open_partition: Opener,
) -> None:
    """A bad body redriven from the DLQ: its audit record carries its key, source and replayed_from."""
    h = await open_partition()
    bad = record(10, K[0], value=b"not json", headers=[*STRIPE, (REPLAYED_FROM_HEADER, b"webhooks.dlq:2:8")])
    await h.handle_and_commit([bad])
    (audit,) = _audit(h)
    assert {k: audit[k] for k in ("key", "outcome", "source", "reason", "replayed_from")} == {
        "key": K[0],
        "outcome": "invalid",
        "source": "stripe",
        "reason": "bad-body",
        "replayed_from": "webhooks.dlq:2:8",
    }
    assert _events(h, "stripe", "invalid") == 1


async def test_a_record_with_a_bad_header_is_audited_under_its_key_as_text(open_partition: Opener) -> None:
    """Before it is classified, a bad-header record's key is its record key decoded with replacement (None if keyless)."""
    h = await open_partition()
    not_utf8 = dataclasses.replace(record(10, None, headers=HOSTILE), key=b"stripe:evt_\xff")
    keyless = record(11, None, headers=HOSTILE)
    await h.handle_and_commit([not_utf8, keyless])
    assert [(a["key"], a["reason"]) for a in _audit(h)] == [
        ("stripe:evt_\ufffd", "bad-header"),
        (None, "bad-header"),
    ]
    assert [d["key"] for d in h.producer.dlq()] == ["stripe:evt_\ufffd", None]


class _Clock:
    """The stage's clock: the monotonic part moved by the test, the wall clock real."""

    def __init__(self) -> None:
        self.now = 5000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def time() -> float:
        return time.time()


async def test_records_dated_past_the_skew_bound_are_all_counted_and_logged_at_most_once_a_minute(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two such records at once make one line; one exactly a minute later makes another; all three are counted."""
    clock = _Clock()
    monkeypatch.setattr(event_stage_module, "time", clock)
    h = await open_partition(max_clock_skew=3600.0)
    caplog.set_level(logging.WARNING, logger="pipeline.worker.event_stage")
    ahead = int(time.time() * 1000) + 2 * 86_400_000
    await h.handle_and_commit([record(10, K[0], timestamp=ahead), record(11, K[1], timestamp=ahead)])
    clock.now += 59.0
    await h.handle_and_commit([record(12, K[2], timestamp=ahead)])
    clock.now += 1.0
    await h.handle_and_commit([record(13, K[3], timestamp=ahead)])
    lines = [m for m in caplog.messages if "ahead of this clock" in m]
    assert [line.split(" is dated")[0] for line in lines] == [
        f"{INPUT}-0 key={K[0]} offset=10",
        f"{INPUT}-0 key={K[3]} offset=13",
    ]
    assert "handled at the bound of 3600s" in lines[0]
    assert h.metrics.registry.get_sample_value("pipeline_clock_skewed_records_total") == 4
