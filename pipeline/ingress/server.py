"""The HTTP ingress: verify a webhook, key it, and answer 2xx only once Kafka has it.

``POST /webhooks/{source}`` checks the body size, verifies the signature with the
source's provider preset (sources with ``verify = "worker"`` or ``"none"`` skip this),
extracts the idempotency key (``<source>:<id>``) and produces the record the contract
describes (key, raw body, ``source``/``received-at``/``http-*`` headers, record
timestamp = receive time) to the partition murmur2 gives the key, with an idempotent
``acks=all`` producer. ``202 {"key", "partition", "offset"}`` follows the broker's ack;
a broker that does not answer within ``produce_timeout`` gives ``503`` with
``Retry-After`` (the provider retries; duplicates are removed downstream).

Also ``GET /healthz`` (the process serves), ``GET /readyz`` (the broker answered
recently) and ``GET /metrics`` (Prometheus text). :class:`Ingress` runs it until
:meth:`Ingress.stop`, then drains in-flight requests and stops the producer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiohttp import web

from pipeline import topology
from pipeline.errors import ConfigError
from pipeline.ingress.app import (
    DEFAULT_MAX_BODY_BYTES,
    HANDLERS,
    NoSecretError,
    build_app,
)
from pipeline.ingress.event_loop import choice_problem, running_loop_name
from pipeline.ingress.metrics import IngressMetrics
from pipeline.ingress.request import BodyTooLargeError
from pipeline.ingress.sink import KafkaSink, Sink
from pipeline.topology import Topology

__all__ = [
    "BodyTooLargeError",
    "Ingress",
    "IngressMetrics",
    "IngressSettings",
    "ManagedSink",
    "NoSecretError",
    "Sink",
    "build_app",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngressSettings:
    """How the HTTP ingress runs (validated at construction)."""

    bootstrap: str
    topology: Path
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    produce_timeout: float = 5.0  # seconds to wait for the broker's ack before answering 503
    trust_forwarded: bool = False  # rebuild the URL from X-Forwarded-Proto/-Host (behind a proxy)
    shutdown_timeout: float = 30.0  # seconds in-flight requests get to finish on stop
    start_timeout: float = 30.0  # seconds to reach the broker at start
    retry_after: int = 5  # seconds in the Retry-After of a 503
    # the loop `pipeline ingress` runs on (auto: uvloop when installed, else asyncio's; see
    # pipeline.ingress.event_loop); an Ingress started inside your own loop runs on that loop
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        problems = []
        if not self.bootstrap.strip():
            problems.append("bootstrap servers are empty")
        if not self.host.strip():
            problems.append("the listen host is empty")
        if not 0 <= self.port < 65536:
            problems.append(f"port must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 1:
            problems.append(f"max body bytes must be at least 1, got {self.max_body_bytes}")
        if not 0 < self.produce_timeout <= 300:
            problems.append(f"produce timeout must be in (0, 300] seconds, got {self.produce_timeout}")
        if not 0 <= self.shutdown_timeout <= 600:
            problems.append(f"shutdown timeout must be in [0, 600] seconds, got {self.shutdown_timeout}")
        if not 0 < self.start_timeout <= 600:
            problems.append(f"start timeout must be in (0, 600] seconds, got {self.start_timeout}")
        if not 0 <= self.retry_after <= 3600:
            problems.append(f"retry-after must be in [0, 3600] seconds, got {self.retry_after}")
        loop_problem = choice_problem(self.event_loop)
        if loop_problem is not None:
            problems.append(loop_problem)
        if problems:
            raise ConfigError("; ".join(problems))


class ManagedSink(Sink, Protocol):
    """A sink with a lifecycle (the ingress starts and stops it)."""

    async def start(self, *, timeout: float = 30.0) -> None:
        """Connect; raise BrokerUnavailableError or ConfigError."""
        ...

    async def stop(self) -> None:
        """Flush and close."""
        ...


class Ingress:
    """Serves webhooks until :meth:`stop` (or SIGTERM through the CLI), then drains."""

    def __init__(
        self,
        settings: IngressSettings,
        topo: Topology | None = None,
        *,
        metrics: IngressMetrics | None = None,
        environ: Mapping[str, str] | None = None,
        sink: ManagedSink | None = None,
    ) -> None:
        self.settings = settings
        self.topology = topo if topo is not None else topology.load(settings.topology)
        self.metrics = metrics or IngressMetrics.create()
        self.sink: ManagedSink = sink or KafkaSink(
            settings.bootstrap,
            self.topology.topics.input,
            timeout=settings.produce_timeout,
            max_record_bytes=settings.max_body_bytes,
        )
        self._environ = environ
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._app: web.Application | None = None

    @property
    def port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("the ingress is not listening")
        return int(self._runner.addresses[0][1])

    async def start(self) -> None:
        """Connect to Kafka, learn the input partitions and start listening."""
        settings = self.settings
        app = build_app(  # first: an invalid provider option fails before anything connects
            self.topology,
            self.sink,
            max_body_bytes=settings.max_body_bytes,
            produce_timeout=settings.produce_timeout,
            trust_forwarded=settings.trust_forwarded,
            retry_after=settings.retry_after,
            metrics=self.metrics,
            environ=self._environ,
        )
        await self.sink.start(timeout=settings.start_timeout)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.shutdown_timeout)
        try:
            await runner.setup()
            await web.TCPSite(runner, settings.host, settings.port).start()
        except OSError as exc:
            await runner.cleanup()
            await self.sink.stop()
            raise ConfigError(
                f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
            ) from None
        self._app, self._runner = app, runner
        log.info(
            "ingress listening on http://%s:%s (input %s, %s partitions, sources: %s; event loop %s)",
            settings.host,
            self.port,
            self.topology.topics.input,
            self.sink.partitions,
            ", ".join(sorted(self.topology.sources)),
            running_loop_name(),
        )

    def stop(self) -> None:
        """Ask :meth:`run` to stop accepting, drain in-flight requests and return."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`; then drain and close the producer."""
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            if self._app is not None:
                self._app[HANDLERS].draining = True
            log.info("ingress stopping: draining in-flight requests")
            await runner.cleanup()  # stops accepting, waits up to shutdown_timeout for handlers
        await self.sink.stop()
        log.info("ingress stopped")
