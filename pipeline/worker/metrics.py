"""Prometheus metrics of the worker (names follow Prometheus conventions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.process_metrics import register_process_collectors

EFFECT_PREFIX = "effect-"  # outcomes the effect stage reports, e.g. effect-duplicate


class Recorder(Protocol):
    """What the processors report as they decide (metrics, or nothing in unit tests)."""

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None: ...
    def command(self, topic: str, count: int = 1) -> None: ...
    def dlq(self, reason: str, count: int = 1) -> None: ...
    def skewed(self, count: int = 1) -> None: ...


class NullRecorder:
    """Records nothing."""

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        """Ignore outcomes."""

    def command(self, topic: str, count: int = 1) -> None:
        """Ignore commands."""

    def dlq(self, reason: str, count: int = 1) -> None:
        """Ignore DLQ records."""

    def skewed(self, count: int = 1) -> None:
        """Ignore records dated too far ahead."""


class Tally:
    """A :class:`Recorder` that sums in plain dicts until :meth:`flush` hands the sums on.

    A Prometheus ``inc`` takes a lock; once per label set and transaction
    instead of once per record, counting costs next to nothing. A partition
    flushes its tally when its transaction commits and clears it when it
    aborts, so the metrics count what was committed, once.
    """

    def __init__(self, target: Recorder) -> None:
        self.target = target
        self._outcomes: dict[tuple[str | None, str], int] = {}
        self._commands: dict[str, int] = {}
        self._dlq: dict[str, int] = {}
        self._skewed = 0

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        """Add to ``(source, outcome)``."""
        key = (source, outcome)
        self._outcomes[key] = self._outcomes.get(key, 0) + count

    def command(self, topic: str, count: int = 1) -> None:
        """Add to ``topic``'s commands."""
        self._commands[topic] = self._commands.get(topic, 0) + count

    def dlq(self, reason: str, count: int = 1) -> None:
        """Add to ``reason``'s DLQ records."""
        self._dlq[reason] = self._dlq.get(reason, 0) + count

    def skewed(self, count: int = 1) -> None:
        """Add to the records dated past the clock-skew bound."""
        self._skewed += count

    def flush(self) -> None:
        """Hand every sum to the target and start again from zero."""
        for (source, outcome), count in self._outcomes.items():
            self.target.outcome(source, outcome, count)
        for topic, count in self._commands.items():
            self.target.command(topic, count)
        for reason, count in self._dlq.items():
            self.target.dlq(reason, count)
        if self._skewed:
            self.target.skewed(self._skewed)
        self.clear()

    def clear(self) -> None:
        """Forget every sum (the transaction they counted was aborted)."""
        self._outcomes.clear()
        self._commands.clear()
        self._dlq.clear()
        self._skewed = 0


@dataclass(frozen=True)
class WorkerMetrics:
    """The worker's metrics, in their own registry (tests run several workers in one process)."""

    registry: CollectorRegistry
    events: Counter
    effect_outcomes: Counter
    commands: Counter
    dlq_records: Counter
    commit_seconds: Histogram
    batch_records: Histogram
    store_keys: Gauge
    store_bytes: Gauge
    keys_expired: Counter
    restore_records: Counter
    partitions: Gauge
    lag: Gauge
    stream_time_behind: Gauge
    restore_remaining: Gauge
    clock_skewed: Counter
    standby_partitions: Gauge
    standby_lag_records: Gauge
    standby_lag_seconds: Gauge
    standby_records: Counter
    topic_config_refused: Gauge
    children: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict)

    @classmethod
    def create(cls) -> WorkerMetrics:
        """Fresh metrics in a fresh registry."""
        registry = CollectorRegistry()
        register_process_collectors(registry)
        return cls(
            registry=registry,
            events=Counter(
                "pipeline_events_total",
                "Input records by source and outcome",
                ["source", "outcome"],
                registry=registry,
            ),
            effect_outcomes=Counter(
                "pipeline_effect_outcomes_total",
                "Effect-stage records (commands keyed by effect key) by source and outcome",
                ["source", "outcome"],
                registry=registry,
            ),
            commands=Counter(
                "pipeline_commands_total", "Commands emitted by topic", ["topic"], registry=registry
            ),
            dlq_records=Counter(
                "pipeline_dlq_records_total",
                "Records sent to the DLQ by reason",
                ["reason"],
                registry=registry,
            ),
            commit_seconds=Histogram(
                "pipeline_transaction_commit_seconds",
                "Time to commit one partition's transaction",
                buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                registry=registry,
            ),
            batch_records=Histogram(
                "pipeline_batch_records",
                "Input records per committed transaction",
                buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000),
                registry=registry,
            ),
            store_keys=Gauge(
                "pipeline_store_keys",
                "Keys in the seen-set per partition",
                ["topic", "partition"],
                registry=registry,
            ),
            store_bytes=Gauge(
                "pipeline_store_disk_bytes",
                "Bytes on disk of the seen-set per partition",
                ["topic", "partition"],
                registry=registry,
            ),
            keys_expired=Counter(
                "pipeline_store_keys_expired_total", "Keys dropped by expiry", registry=registry
            ),
            restore_records=Counter(
                "pipeline_restore_records_total",
                "Changelog records replayed by restores",
                registry=registry,
            ),
            partitions=Gauge(
                "pipeline_assigned_partitions",
                "Input partitions this worker owns",
                registry=registry,
            ),
            lag=Gauge(
                "pipeline_consumer_lag",
                "Records behind the end of the partition",
                ["topic", "partition"],
                registry=registry,
            ),
            stream_time_behind=Gauge(
                "pipeline_stream_time_behind_seconds",
                "How far the partition's stream time (its latest record's time) is behind the clock",
                ["topic", "partition"],
                registry=registry,
            ),
            restore_remaining=Gauge(
                "pipeline_restore_remaining_records",
                "Changelog records left to replay per partition",
                ["topic", "partition"],
                registry=registry,
            ),
            clock_skewed=Counter(
                "pipeline_clock_skewed_records_total",
                "Records dated further ahead of the wall clock than --max-clock-skew, handled at that bound",
                registry=registry,
            ),
            standby_partitions=Gauge(
                "pipeline_standby_partitions",
                "Partitions this worker keeps a standby replica of",
                registry=registry,
            ),
            standby_lag_records=Gauge(
                "pipeline_standby_lag_records",
                "Changelog records a standby replica is behind its changelog's end, per partition",
                ["topic", "partition"],
                registry=registry,
            ),
            standby_lag_seconds=Gauge(
                "pipeline_standby_lag_seconds",
                "Seconds since a standby replica was last level with its changelog (0 while it is), per partition",
                ["topic", "partition"],
                registry=registry,
            ),
            standby_records=Counter(
                "pipeline_standby_records_total",
                "Changelog records replayed into standby replicas",
                registry=registry,
            ),
            topic_config_refused=Gauge(
                "pipeline_topic_config_refused",
                "1 while a topic's config is one a worker refuses to start on (a changelog's retention lowered)",
                registry=registry,
            ),
        )

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        """Count input records' outcomes; the effect stage's (``effect-*``) apart, so input counts stay input."""
        if outcome.startswith(EFFECT_PREFIX):
            self._child(self.effect_outcomes, (source or "unknown", outcome[len(EFFECT_PREFIX) :])).inc(count)
            return
        self._child(self.events, (source or "unknown", outcome)).inc(count)

    def command(self, topic: str, count: int = 1) -> None:
        """Count commands emitted to ``topic``."""
        self._child(self.commands, (topic,)).inc(count)

    def dlq(self, reason: str, count: int = 1) -> None:
        """Count DLQ records."""
        self._child(self.dlq_records, (reason,)).inc(count)

    def skewed(self, count: int = 1) -> None:
        """Count records dated past the clock-skew bound."""
        self.clock_skewed.inc(count)

    def _child(self, metric: Counter, labels: tuple[str, ...]) -> Any:
        """``metric.labels(*labels)``, remembered: ``labels()`` is costly on the per-record path."""
        key = (id(metric), labels)  # the metrics live as long as this object
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = metric.labels(*labels)
        return child
