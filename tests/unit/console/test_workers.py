"""What the console reads from a worker's ``/metrics``, and the rates it draws from samples."""

from __future__ import annotations

from pipeline.console.workers import Live, Sample, WorkerView, _read_health, _read_metrics

METRICS = """
# HELP pipeline_events_total Input records by source and outcome
# TYPE pipeline_events_total counter
pipeline_events_total{outcome="first",source="stripe"} 10.0
pipeline_events_total{outcome="first",source="github"} 5.0
pipeline_events_total{outcome="duplicate",source="stripe"} 3.0
pipeline_events_total{outcome="conflict",source="stripe"} 1.0
# TYPE pipeline_dlq_records_total counter
pipeline_dlq_records_total{reason="bad-body"} 2.0
# TYPE pipeline_consumer_lag gauge
pipeline_consumer_lag{partition="1",topic="webhooks.raw"} 7.0
# TYPE pipeline_restore_remaining_records gauge
pipeline_restore_remaining_records{partition="0",topic="webhooks.raw"} 120.0
"""


def test_a_workers_metrics_give_the_counters_and_per_partition_gauges() -> None:
    """First copies, duplicates (not conflicts) and DLQ records are summed; lag and restore are kept per partition."""
    view = WorkerView("w:1")
    _read_metrics(view, METRICS)
    assert view.totals == {"accepted": 15.0, "duplicates": 3.0, "dlq": 2.0}
    assert view.gauge("pipeline_consumer_lag", "webhooks.raw", 1) == 7.0
    assert view.gauge("pipeline_restore_remaining_records", "webhooks.raw", 0) == 120.0
    assert view.gauge("pipeline_consumer_lag", "webhooks.raw", 0) is None


def test_rates_are_per_second_between_samples_and_never_negative() -> None:
    """A counter that drops (a restarted worker) reads as 0, not as a negative rate."""
    live = Live((), every=1.0)
    totals = [(0.0, 0.0), (2.0, 10.0), (4.0, 4.0)]
    for at, accepted in totals:
        live.samples.append(Sample(at, {"w:1": {"accepted": accepted, "duplicates": 0.0, "dlq": 0.0}}))
    assert live.rates()["accepted"] == [5.0, 0.0]


def test_a_worker_missing_from_one_sample_neither_hides_the_others_nor_spikes_on_its_return() -> None:
    """Rates are each worker's own increase: one unreachable for a sample adds nothing to those intervals,
    and its lifetime counter is not read as one interval's traffic when it answers again."""
    live = Live((), every=1.0)
    samples = [
        (0.0, {"a": 100.0, "b": 1000.0}),
        (1.0, {"a": 110.0}),  # b unreachable
        (2.0, {"a": 120.0, "b": 1020.0}),
    ]
    for at, counters in samples:
        live.samples.append(Sample(at, {w: {"accepted": n} for w, n in counters.items()}))
    assert live.rates()["accepted"] == [10.0, 10.0]


def test_a_workers_warnings_are_read_beside_its_problems_and_leave_it_healthy() -> None:
    """A ready worker whose /readyz warns (a changelog's retention lowered under it): healthy, alive, no
    problem, the warning kept as it said it."""
    view = WorkerView("w:1", healthy=True)
    _read_health(
        view,
        {
            "status": "ok",
            "partitions": {"webhooks.raw-0": "ready"},
            "warnings": [
                "changelog c has retention.ms=3600000 (1 h), shorter than the largest TTL plus a day"
            ],
        },
    )
    assert view.alive
    assert view.problems == []
    assert view.states == {"webhooks.raw-0": "ready"}
    assert view.warnings == [
        "changelog c has retention.ms=3600000 (1 h), shorter than the largest TTL plus a day"
    ]
