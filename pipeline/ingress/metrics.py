"""Prometheus metrics of the HTTP ingress, in their own registry (tests run several ingresses).

Every request is counted on the event loop's thread, so the counts are plain integers
kept by :class:`IngressMetrics` and read by its collector at scrape time, instead of
``prometheus_client``'s ``Counter`` and ``Histogram``, which take a lock per update (a
few microseconds per request; ``docs/benchmarks.md``, Ingress). The exposition is the
same: ``pipeline_ingress_requests_total{source,status}``,
``pipeline_ingress_request_seconds{source}`` and ``pipeline_ingress_body_bytes``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pipeline.process_metrics import register_process_collectors

#: The ``source`` label of requests to a source the topology does not have (bounded cardinality).
UNKNOWN_SOURCE_LABEL = "-"

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


class _Histogram:
    """Observations in buckets by upper bound (``le``), plus their count and sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is at least ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, as the exposition format has them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
        return out


class IngressMetrics(Collector):
    """Requests by source and status, their latency by source, and body sizes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._requests: dict[tuple[str, int], int] = {}
        self._seconds: dict[str, _Histogram] = {}
        self._body_bytes = _Histogram(BYTES_BUCKETS)

    @classmethod
    def create(cls) -> IngressMetrics:
        """Fresh metrics in a fresh registry, with the process collectors."""
        registry = CollectorRegistry()
        register_process_collectors(registry)
        metrics = cls(registry)
        registry.register(metrics)
        return metrics

    def request(self, source: str, status: int, seconds: float) -> None:
        """Count one answered request and observe its latency."""
        key = (source, status)
        self._requests[key] = self._requests.get(key, 0) + 1
        histogram = self._seconds.get(source)
        if histogram is None:
            histogram = self._seconds[source] = _Histogram(SECONDS_BUCKETS)
        histogram.observe(seconds)

    def body(self, size: int) -> None:
        """Observe the size of a body read for processing."""
        self._body_bytes.observe(size)

    def collect(self) -> Iterator[Metric]:
        """The three families, as ``prometheus_client`` would have exposed them."""
        requests = CounterMetricFamily(
            "pipeline_ingress_requests",
            "Webhook requests by source and HTTP status",
            labels=["source", "status"],
        )
        for (source, status), count in sorted(self._requests.items()):
            requests.add_metric([source, str(status)], float(count))
        yield requests
        seconds = HistogramMetricFamily(
            "pipeline_ingress_request_seconds",
            "Time from receiving a webhook to answering it (includes the broker ack)",
            labels=["source"],
        )
        for source, histogram in sorted(self._seconds.items()):
            seconds.add_metric([source], histogram.buckets(), histogram.total)
        yield seconds
        body = HistogramMetricFamily(
            "pipeline_ingress_body_bytes", "Size of accepted-for-processing webhook bodies"
        )
        body.add_metric([], self._body_bytes.buckets(), self._body_bytes.total)
        yield body
