"""The ingress's aiohttp application: ``POST /webhooks/{source}``, probes and metrics.

:func:`build_app` wires the handlers to a :class:`~pipeline.ingress.sink.Sink`; the
:class:`~pipeline.ingress.server.Ingress` service runs it on a port with a Kafka sink, and tests
run it with ``aiohttp.test_utils`` and a fake sink. See :mod:`pipeline.ingress.server` for what
each endpoint answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline import contract, providers
from pipeline.credentials import source_secrets
from pipeline.errors import (
    BodyError,
    BrokerUnavailableError,
    InvalidRecordError,
    PipelineError,
    SignatureError,
    UnknownSourceError,
)
from pipeline.ingress.deadline import Deadlines
from pipeline.ingress.metrics import UNKNOWN_SOURCE_LABEL, IngressMetrics
from pipeline.ingress.request import (
    STATUS,
    check_content_encoding,
    check_event_id,
    read_body,
)
from pipeline.ingress.sink import OutgoingRecord, Produced, RecordTooLargeForBrokerError, Sink
from pipeline.kafka.partitioner import owner_partition
from pipeline.log_text import escape
from pipeline.providers.base import Provider
from pipeline.topology import Topology, Verify

log = logging.getLogger("pipeline.ingress.server")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024

#: Headers that describe one hop, not the webhook (RFC 9110 §7.6.1), plus framing.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "expect",
    }
)
#: Credentials of the hop (a proxy's basic auth, cookies): never written to Kafka.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
#: aiohttp decodes a gzip/deflate/br body before the handler sees it, so the stored value is
#: the decoded body and a copied Content-Encoding header would misdescribe it.
DECODED_HEADERS = frozenset({"content-encoding"})
#: Every request header name that is never copied into the record.
NOT_COPIED = HOP_BY_HOP | CREDENTIAL_HEADERS | DECODED_HEADERS


class NoSecretError(SignatureError):
    """A source verified at the ingress has none of its secret variables set."""

    reason = "no-secret"


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    provider: Provider
    secrets: tuple[str, ...]
    verify: bool


def _json(
    status: int, payload: Mapping[str, object], headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(payload), content_type="application/json", headers=headers
    )


class _Handlers:
    """The request handlers of one app (state shared by them)."""

    def __init__(
        self,
        topo: Topology,
        sink: Sink,
        *,
        max_body_bytes: int,
        produce_timeout: float,
        trust_forwarded: bool,
        retry_after: int,
        metrics: IngressMetrics,
        environ: Mapping[str, str] | None,
        clock: Callable[[], float],
    ) -> None:
        self.topic = topo.topics.input
        self.sink = sink
        self.max_body_bytes = max_body_bytes
        self.produce_timeout = produce_timeout
        self.deadlines = Deadlines(produce_timeout)
        self.trust_forwarded = trust_forwarded
        self.retry_after = retry_after
        self.metrics = metrics
        self.clock = clock
        self.draining = False
        self.sources: dict[str, _Source] = {}
        for name, source in topo.sources.items():
            secrets = tuple(source_secrets(source, environ))
            verify = source.verify is Verify.INGRESS
            if verify and not secrets:
                log.warning(
                    "source %s: none of %s is set; its webhooks are refused with 401",
                    name,
                    ", ".join(source.secret_env) or "its secret variables",
                )
            provider = providers.get(source.provider, **source.options)
            self.sources[name] = _Source(name, provider, secrets, verify)

    # -- POST /webhooks/{source} ----------------------------------------------------
    async def webhook(self, request: web.Request) -> web.Response:
        """Verify, key and produce one webhook; the answer follows the broker's ack."""
        started = time.perf_counter()
        name = request.match_info["source"]
        source = self.sources.get(name)
        label = name if source is not None else UNKNOWN_SOURCE_LABEL
        status = 500
        try:
            response = await self._webhook(request, name, source)
            status = response.status
            return response
        finally:
            self.metrics.request(label, status, time.perf_counter() - started)

    async def _webhook(self, request: web.Request, name: str, source: _Source | None) -> web.Response:
        received_at = self.clock()
        if source is None:
            error = UnknownSourceError(f"source {escape(name, 64)!r} is not configured")
            log.warning("refused webhook for unknown source %s key=-: 404", escape(name, 64))
            return self._refuse(404, error)
        try:
            check_content_encoding(request)
            body = await read_body(request, self.max_body_bytes)
        except BodyError as exc:  # too large, undecodable, unsupported coding, cut short
            status = STATUS.get(type(exc), 400)
            log.warning(
                "refused webhook from %s key=-: %s %s: %s", source.name, status, exc.reason, escape(exc, 500)
            )
            return self._refuse(status, exc)
        self.metrics.body(len(body))
        headers = request.headers
        try:
            if source.verify:
                if not source.secrets:
                    raise NoSecretError(f"no secret configured for source {source.name}")
                source.provider.verify(headers, body, source.secrets, now=received_at, url=self._url(request))
            event_id = check_event_id(source.provider.idempotency_key(headers, body).strip())
            if not event_id:
                raise BodyError("the idempotency key is empty")
            providers.check_body(body, source.provider.name)  # the worker takes JSON objects only
        except SignatureError as exc:
            return self._refuse(401, exc, source=source, body=body, request=request)
        except InvalidRecordError as exc:  # MissingKeyError, BodyError
            return self._refuse(400, exc, source=source, body=body, request=request)
        key = f"{source.name}:{event_id}"
        return await self._produce(request, source, key, body, received_at)

    def _url(self, request: web.Request) -> str:
        """The URL as the sender addressed it (Square signs it)."""
        scheme, host = request.scheme, request.host
        if self.trust_forwarded:
            proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
            forwarded_host = request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()
            scheme = proto if proto in ("http", "https") else scheme
            host = forwarded_host or host
        return f"{scheme}://{host}{request.raw_path}"

    async def _produce(
        self, request: web.Request, source: _Source, key: str, body: bytes, received_at: float
    ) -> web.Response:
        received_ms = int(received_at * 1000)
        key_bytes = key.encode("utf-8")
        skip = NOT_COPIED | self._connection_tokens(request)
        record = OutgoingRecord(
            key=key_bytes,
            value=body,
            headers=contract.http_headers_to_kafka(
                request.headers, source=source.name, received_at=received_ms, skip=skip
            ),
            partition=owner_partition(key_bytes, self.sink.partitions),
            timestamp_ms=received_ms,
        )
        shown = escape(key)
        try:
            with self.deadlines.wait():  # one timer for every request's wait (see deadline.py)
                produced: Produced = await self.sink.send(record)
        except TimeoutError:
            error = BrokerUnavailableError(f"Kafka did not acknowledge within {self.produce_timeout:g}s")
            log.warning("deferred webhook key=%s: 503 %s", shown, error)
            return self._refuse(503, error, headers={"Retry-After": str(self.retry_after)})
        except BrokerUnavailableError as exc:
            log.warning("deferred webhook key=%s: 503 %s", shown, exc)
            return self._refuse(503, exc, headers={"Retry-After": str(self.retry_after)})
        except RecordTooLargeForBrokerError as exc:
            log.warning("refused webhook key=%s: 413 %s", shown, exc)
            return self._refuse(413, exc)
        log.debug(  # one per request: DEBUG, as the worker's per-delivery line (docs/operations.md, Logs)
            "accepted webhook key=%s partition=%s offset=%s bytes=%s",
            shown,
            produced.partition,
            produced.offset,
            len(body),
        )
        return _json(202, {"key": key, "partition": produced.partition, "offset": produced.offset})

    @staticmethod
    def _connection_tokens(request: web.Request) -> frozenset[str]:
        """Headers the ``Connection`` header names as hop-by-hop."""
        tokens: set[str] = set()
        for value in request.headers.getall("Connection", ()):
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
        return frozenset(tokens)

    def _refuse(
        self,
        status: int,
        error: PipelineError,
        *,
        source: _Source | None = None,
        body: bytes = b"",
        request: web.Request | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        if source is not None and request is not None:
            log.warning(
                "refused webhook from %s key=%s: %s %s: %s",
                source.name,
                self._key_for_log(source, request, body),
                status,
                error.reason,
                escape(error, 500),
            )
        return _json(status, {"error": str(error), "reason": error.reason}, headers)

    @staticmethod
    def _key_for_log(source: _Source, request: web.Request, body: bytes) -> str:
        try:
            return escape(f"{source.name}:{source.provider.idempotency_key(request.headers, body).strip()}")
        except InvalidRecordError:
            return "-"

    # -- probes and metrics ---------------------------------------------------------
    async def healthz(self, _request: web.Request) -> web.Response:
        """200 while the process serves."""
        return _json(200, {"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        """200 when the broker answered recently, else 503."""
        if self.draining:
            return _json(503, {"status": "draining"})
        try:
            ready = await asyncio.wait_for(self.sink.ready(), self.produce_timeout)
        except TimeoutError:
            ready = False
        if ready:
            return _json(200, {"status": "ready"})
        return _json(503, {"status": "broker-unavailable"}, {"Retry-After": str(self.retry_after)})

    async def metrics_text(self, _request: web.Request) -> web.Response:
        """The ingress's metrics in Prometheus text format."""
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


HANDLERS = web.AppKey("pipeline.ingress.server.handlers", _Handlers)


def build_app(
    topo: Topology,
    sink: Sink,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    produce_timeout: float = 5.0,
    trust_forwarded: bool = False,
    retry_after: int = 5,
    metrics: IngressMetrics | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The ingress as an aiohttp application writing to ``sink``.

    Secrets are read from ``environ`` (default ``os.environ``) once, here. ``clock`` gives
    the receive time in unix seconds (signature windows and ``received-at``).
    """
    handlers = _Handlers(
        topo,
        sink,
        max_body_bytes=max_body_bytes,
        produce_timeout=produce_timeout,
        trust_forwarded=trust_forwarded,
        retry_after=retry_after,
        metrics=metrics or IngressMetrics.create(),
        environ=environ,
        clock=clock,
    )
    app = web.Application(client_max_size=max_body_bytes)
    app[HANDLERS] = handlers
    app.router.add_post("/webhooks/{source}", handlers.webhook)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_text)
    return app
