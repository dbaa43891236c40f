"""The process's own Prometheus collectors, the same for every service (worker, ingress)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector


def register_process_collectors(registry: CollectorRegistry) -> None:
    """The process's CPU, memory and file descriptors, the Python platform and GC, in ``registry``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
