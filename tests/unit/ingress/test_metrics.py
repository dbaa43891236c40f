"""The ingress's lock-free request counts expose exactly what prometheus_client's own metrics would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pipeline.ingress.metrics import BYTES_BUCKETS, SECONDS_BUCKETS, IngressMetrics

REQUESTS = [("stripe", 202, 0.012), ("stripe", 202, 0.0005), ("-", 404, 0.003), ("stripe", 503, 12.0)]
BODIES = [0, 300, 1024, 5000, 4_194_305]


def _exposed(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "pipeline_ingress" in line and "_created" not in line)


def _reference() -> CollectorRegistry:
    registry = CollectorRegistry()
    requests = Counter(
        "pipeline_ingress_requests_total",
        "Webhook requests by source and HTTP status",
        ["source", "status"],
        registry=registry,
    )
    seconds = Histogram(
        "pipeline_ingress_request_seconds",
        "Time from receiving a webhook to answering it (includes the broker ack)",
        ["source"],
        buckets=SECONDS_BUCKETS,
        registry=registry,
    )
    body = Histogram(
        "pipeline_ingress_body_bytes",
        "Size of accepted-for-processing webhook bodies",
        buckets=BYTES_BUCKETS,
        registry=registry,
    )
    for source, status, took in REQUESTS:
        requests.labels(source, str(status)).inc()
        seconds.labels(source).observe(took)
    for size in BODIES:
        body.observe(size)
    return registry


def test_the_exposition_is_what_prometheus_clients_own_metrics_give() -> None:
    """Same names, help, labels, buckets (bounds on the edge included), counts and sums."""
    metrics = IngressMetrics.create()
    for source, status, took in REQUESTS:
        metrics.request(source, status, took)
    for size in BODIES:
        metrics.body(size)
    assert _exposed(metrics.registry) == _exposed(_reference())


def test_fresh_metrics_expose_empty_families_and_the_process_collectors() -> None:
    """Before any request the families exist with zero bodies, next to the process metrics."""
    text = generate_latest(IngressMetrics.create().registry).decode()
    assert "pipeline_ingress_body_bytes_count 0.0" in text
    assert "# TYPE pipeline_ingress_requests_total counter" in text
    assert "process_cpu_seconds_total" in text
