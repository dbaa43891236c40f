"""Counting outcomes: sums per chunk reach the Prometheus counters unchanged."""

from __future__ import annotations

from pipeline.worker.metrics import Tally, WorkerMetrics


def test_a_tally_hands_on_exact_sums_and_starts_again() -> None:
    """Counts kept in a Tally reach the worker's counters on flush, once, with the same totals."""
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    for _ in range(3):
        tally.outcome("stripe", "first")
    tally.outcome(None, "invalid")
    tally.command("webhooks.events", 2)
    tally.dlq("bad-signature")
    assert (
        metrics.registry.get_sample_value("pipeline_events_total", {"source": "stripe", "outcome": "first"})
        is None
    )
    tally.flush()
    tally.flush()
    sample = metrics.registry.get_sample_value
    assert sample("pipeline_events_total", {"source": "stripe", "outcome": "first"}) == 3
    assert sample("pipeline_events_total", {"source": "unknown", "outcome": "invalid"}) == 1
    assert sample("pipeline_commands_total", {"topic": "webhooks.events"}) == 2
    assert sample("pipeline_dlq_records_total", {"reason": "bad-signature"}) == 1


def test_effect_stage_outcomes_are_counted_apart_from_input_records() -> None:
    """effect-* outcomes go to pipeline_effect_outcomes_total, so input counts and their duplicate ratio stay input."""
    metrics = WorkerMetrics.create()
    metrics.outcome("stripe", "first")
    metrics.outcome("stripe", "effect-duplicate", 2)
    registry = metrics.registry
    assert registry.get_sample_value("pipeline_events_total", {"source": "stripe", "outcome": "first"}) == 1
    assert (
        registry.get_sample_value(
            "pipeline_events_total", {"source": "stripe", "outcome": "effect-duplicate"}
        )
        is None
    )
    effect = registry.get_sample_value(
        "pipeline_effect_outcomes_total", {"source": "stripe", "outcome": "duplicate"}
    )
    assert effect == 2


def test_each_call_without_a_count_counts_one_and_repeats_add_up() -> None:
    """dlq and skewed count one per call by default, in a Tally and in the worker's counters; repeats add up."""
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.dlq("bad-body")
    tally.dlq("bad-body")
    tally.skewed()
    tally.skewed()
    tally.flush()
    metrics.dlq("bad-body")
    metrics.skewed()
    sample = metrics.registry.get_sample_value
    assert sample("pipeline_dlq_records_total", {"reason": "bad-body"}) == 3
    assert sample("pipeline_clock_skewed_records_total") == 3
