"""Handle every webhook exactly once: Kafka + RocksDB dedupe with exactly-once effects.

The public surface is small and loaded on first use (importing ``pipeline``
does no work): :class:`Worker` and :class:`WorkerSettings` run the dedupe
worker, :class:`Ingress` and :class:`IngressSettings` the HTTP ingress,
:func:`load_topology` reads a topology, and :class:`PipelineError` is the root
of every error raised on purpose (``pipeline.errors`` has the tree).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Ingress": ("pipeline.ingress.server", "Ingress"),
    "IngressSettings": ("pipeline.ingress.server", "IngressSettings"),
    "PipelineError": ("pipeline.errors", "PipelineError"),
    "Worker": ("pipeline.worker.loop", "Worker"),
    "WorkerSettings": ("pipeline.worker.settings", "WorkerSettings"),
    "load_topology": ("pipeline.topology", "load"),
}

if TYPE_CHECKING:
    from pipeline.errors import PipelineError
    from pipeline.ingress.server import Ingress, IngressSettings
    from pipeline.topology import load as load_topology
    from pipeline.worker.loop import Worker
    from pipeline.worker.settings import WorkerSettings

__all__ = [
    "Ingress",
    "IngressSettings",
    "PipelineError",
    "Worker",
    "WorkerSettings",
    "__version__",
    "load_topology",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attribute)
