"""The worker's /metrics exposition: each family's name, type, help, labels and buckets; what each call counts."""

from __future__ import annotations

from typing import Any

from pipeline.worker.metrics import Tally, WorkerMetrics

#: Every family the worker exposes (docs/operations.md, Metrics), as Prometheus lists it.
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pipeline_events": ("counter", "Input records by source and outcome", ("source", "outcome")),
    "pipeline_effect_outcomes": (
        "counter",
        "Effect-stage records (commands keyed by effect key) by source and outcome",
        ("source", "outcome"),
    ),
    "pipeline_commands": ("counter", "Commands emitted by topic", ("topic",)),
    "pipeline_dlq_records": ("counter", "Records sent to the DLQ by reason", ("reason",)),
    "pipeline_transaction_commit_seconds": ("histogram", "Time to commit one partition's transaction", ()),
    "pipeline_batch_records": ("histogram", "Input records per committed transaction", ()),
    "pipeline_store_keys": ("gauge", "Keys in the seen-set per partition", ("topic", "partition")),
    "pipeline_store_disk_bytes": (
        "gauge",
        "Bytes on disk of the seen-set per partition",
        ("topic", "partition"),
    ),
    "pipeline_store_keys_expired": ("counter", "Keys dropped by expiry", ()),
    "pipeline_restore_records": ("counter", "Changelog records replayed by restores", ()),
    "pipeline_assigned_partitions": ("gauge", "Input partitions this worker owns", ()),
    "pipeline_consumer_lag": ("gauge", "Records behind the end of the partition", ("topic", "partition")),
    "pipeline_stream_time_behind_seconds": (
        "gauge",
        "How far the partition's stream time (its latest record's time) is behind the clock",
        ("topic", "partition"),
    ),
    "pipeline_restore_remaining_records": (
        "gauge",
        "Changelog records left to replay per partition",
        ("topic", "partition"),
    ),
    "pipeline_clock_skewed_records": (
        "counter",
        "Records dated further ahead of the wall clock than --max-clock-skew, handled at that bound",
        (),
    ),
    "pipeline_standby_partitions": ("gauge", "Partitions this worker keeps a standby replica of", ()),
    "pipeline_standby_lag_records": (
        "gauge",
        "Changelog records a standby replica is behind its changelog's end, per partition",
        ("topic", "partition"),
    ),
    "pipeline_standby_lag_seconds": (
        "gauge",
        "Seconds since a standby replica was last level with its changelog (0 while it is), per partition",
        ("topic", "partition"),
    ),
    "pipeline_standby_records": ("counter", "Changelog records replayed into standby replicas", ()),
    "pipeline_topic_config_refused": (
        "gauge",
        "1 while a topic's config is one a worker refuses to start on (a changelog's retention lowered)",
        (),
    ),
}

#: The attribute of :class:`WorkerMetrics` behind each family.
ATTRIBUTES = {
    "pipeline_events": "events",
    "pipeline_effect_outcomes": "effect_outcomes",
    "pipeline_commands": "commands",
    "pipeline_dlq_records": "dlq_records",
    "pipeline_transaction_commit_seconds": "commit_seconds",
    "pipeline_batch_records": "batch_records",
    "pipeline_store_keys": "store_keys",
    "pipeline_store_disk_bytes": "store_bytes",
    "pipeline_store_keys_expired": "keys_expired",
    "pipeline_restore_records": "restore_records",
    "pipeline_assigned_partitions": "partitions",
    "pipeline_consumer_lag": "lag",
    "pipeline_stream_time_behind_seconds": "stream_time_behind",
    "pipeline_restore_remaining_records": "restore_remaining",
    "pipeline_clock_skewed_records": "clock_skewed",
    "pipeline_standby_partitions": "standby_partitions",
    "pipeline_standby_lag_records": "standby_lag_records",
    "pipeline_standby_lag_seconds": "standby_lag_seconds",
    "pipeline_standby_records": "standby_records",
    "pipeline_topic_config_refused": "topic_config_refused",
}

BUCKETS: dict[str, list[float]] = {
    "pipeline_transaction_commit_seconds": [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    "pipeline_batch_records": [1, 10, 50, 100, 250, 500, 1000, 2000, 5000],
}


def _touch(metrics: WorkerMetrics) -> None:
    """One sample in every family, each labelled family by its label names."""
    for family, (kind, _, labels) in FAMILIES.items():
        metric: Any = getattr(metrics, ATTRIBUTES[family])
        if labels:
            metric = metric.labels(**dict.fromkeys(labels, "x"))
        if kind == "counter":
            metric.inc()
        elif kind == "gauge":
            metric.set(1)
        else:
            metric.observe(1)


def test_each_worker_family_is_exposed_with_its_type_help_and_labels() -> None:
    """/metrics lists every pipeline_* family with its type, help line and label names, in the worker's own registry."""
    metrics = WorkerMetrics.create()
    _touch(metrics)
    families = {f.name: f for f in metrics.registry.collect() if f.name.startswith("pipeline_")}
    assert {name: (f.type, f.documentation) for name, f in families.items()} == {
        name: (kind, text) for name, (kind, text, _) in FAMILIES.items()
    }
    for name, family in families.items():
        labels = {key for sample in family.samples for key in sample.labels if key != "le"}
        assert labels == set(FAMILIES[name][2]), name


def test_the_histograms_have_their_buckets() -> None:
    """Commit seconds and batch records are exposed in the buckets dashboards and alerts rely on."""
    metrics = WorkerMetrics.create()
    for family in metrics.registry.collect():
        if family.name in BUCKETS:
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert bounds == [*map(float, BUCKETS[family.name]), float("inf")], family.name


def test_the_process_collectors_are_in_the_workers_registry_and_workers_do_not_share_one() -> None:
    """A worker's registry holds the process families as well as its own; a second worker's metrics are apart."""
    first, second = WorkerMetrics.create(), WorkerMetrics.create()
    names = {f.name for f in first.registry.collect()}
    assert {"process_cpu_seconds", "python_info", "python_gc_collections"} <= names
    first.command("t")
    assert first.registry.get_sample_value("pipeline_commands_total", {"topic": "t"}) == 1
    assert second.registry.get_sample_value("pipeline_commands_total", {"topic": "t"}) is None


def test_the_same_label_on_two_families_is_counted_in_each_apart() -> None:
    """A DLQ reason named like a command topic, an outcome like both: each call counts only in its own family."""
    metrics = WorkerMetrics.create()
    metrics.command("same")
    metrics.dlq("same", 2)
    metrics.outcome("same", "same", 3)
    metrics.outcome("same", "effect-same", 4)
    metrics.command("same")
    sample = metrics.registry.get_sample_value
    assert sample("pipeline_commands_total", {"topic": "same"}) == 2
    assert sample("pipeline_dlq_records_total", {"reason": "same"}) == 2
    assert sample("pipeline_events_total", {"source": "same", "outcome": "same"}) == 3
    assert sample("pipeline_effect_outcomes_total", {"source": "same", "outcome": "same"}) == 4


def test_calls_without_a_count_count_one_and_a_missing_source_is_unknown() -> None:
    """outcome and command count one per call by default, and a tally adds repeats up; an effect outcome without a source is unknown too."""
    metrics = WorkerMetrics.create()
    metrics.outcome("stripe", "first")
    metrics.outcome(None, "effect-duplicate")
    metrics.command("orders")
    tally = Tally(metrics)
    tally.outcome("stripe", "first")
    tally.command("orders")
    tally.command("orders")
    tally.flush()
    sample = metrics.registry.get_sample_value
    assert sample("pipeline_events_total", {"source": "stripe", "outcome": "first"}) == 2
    assert sample("pipeline_effect_outcomes_total", {"source": "unknown", "outcome": "duplicate"}) == 1
    assert sample("pipeline_commands_total", {"topic": "orders"}) == 3


def test_a_tally_with_no_skewed_record_counts_none_before_or_after_a_flush() -> None:
    """No record past the skew bound: the skew counter stays at zero, after a flush that had some too."""
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.outcome("stripe", "first")
    tally.flush()
    assert metrics.registry.get_sample_value("pipeline_clock_skewed_records_total") == 0
    tally.skewed(2)
    tally.flush()
    tally.outcome("stripe", "first")
    tally.flush()
    assert metrics.registry.get_sample_value("pipeline_clock_skewed_records_total") == 2


def test_a_cleared_tally_hands_on_nothing_of_what_it_held() -> None:
    """clear() (an aborted transaction) forgets every sum: the next flush counts only what came after it."""
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.outcome("stripe", "first", 5)
    tally.command("orders", 5)
    tally.dlq("bad-body", 5)
    tally.skewed(5)
    tally.clear()
    tally.outcome("stripe", "first")
    tally.flush()
    sample = metrics.registry.get_sample_value
    assert sample("pipeline_events_total", {"source": "stripe", "outcome": "first"}) == 1
    assert sample("pipeline_commands_total", {"topic": "orders"}) is None
    assert sample("pipeline_dlq_records_total", {"reason": "bad-body"}) is None
    assert sample("pipeline_clock_skewed_records_total") == 0
