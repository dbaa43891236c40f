"""Prometheus metrics of the HTTP ingress, in their own registry (tests run several ingresses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

#: The ``source`` label of requests to a source the topology does not have (bounded cardinality).
UNKNOWN_SOURCE_LABEL = "-"


@dataclass(frozen=True)
class IngressMetrics:
    """Requests by source and status, their latency, and body sizes."""

    registry: CollectorRegistry
    requests: Counter
    request_seconds: Histogram
    body_bytes: Histogram
    #: labelled children, looked up once per label set instead of per request (bounded: sources x statuses)
    _children: dict[tuple[str, int], tuple[Any, Any]] = field(default_factory=dict, repr=False)

    def request(self, source: str, status: int, seconds: float) -> None:
        """Count one answered request and observe its latency."""
        children = self._children.get((source, status))
        if children is None:
            children = (self.requests.labels(source, str(status)), self.request_seconds.labels(source))
            self._children[(source, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    @classmethod
    def create(cls) -> IngressMetrics:
        """Fresh metrics in a fresh registry."""
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # CPU, memory, file descriptors of the process
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        return cls(
            registry=registry,
            requests=Counter(
                "pipeline_ingress_requests_total",
                "Webhook requests by source and HTTP status",
                ["source", "status"],
                registry=registry,
            ),
            request_seconds=Histogram(
                "pipeline_ingress_request_seconds",
                "Time from receiving a webhook to answering it (includes the broker ack)",
                ["source"],
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                registry=registry,
            ),
            body_bytes=Histogram(
                "pipeline_ingress_body_bytes",
                "Size of accepted-for-processing webhook bodies",
                buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
                registry=registry,
            ),
        )
