"""Classify an input record before the dedupe decision: pure logic, no Kafka.

A record becomes one of:

- :class:`Invalid`: it cannot be processed (no source, unknown source, no key,
  unreadable body, failed signature, a key its verified request does not carry);
  it goes to the DLQ with the reason and is never recorded as seen;
- :class:`Reroute`: its key hashes to another partition (or it had no key and
  its derived key does); it is moved to the owning partition, inside the
  transaction, and deduped only there;
- :class:`Accepted`: it is on its owning partition with a scoped key, parsed
  and verified; the dedupe decision comes next.

A source verified in the worker (``verify = "worker"``) is verified first, and its key is
the provider's event id read from the verified request; a record key (or ``idempotency-key``
header) that says otherwise is ``key-mismatch``: trusting it would let a validly signed body
of event B be filed under A's key, claiming A and suppressing the genuine A.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from pipeline import providers
from pipeline.contract import Delivery
from pipeline.credentials import source_secrets
from pipeline.errors import InvalidRecordError, KeyMismatchError, MissingKeyError, UnknownSourceError
from pipeline.headers import IDEMPOTENCY_KEY_HEADER
from pipeline.providers.base import Provider
from pipeline.topology import Source, Topology, Verify

Partitioner = Callable[[bytes, int], int]


class Invalid(NamedTuple):
    """A record for the DLQ."""

    reason: str
    error: str
    key: str | None = None
    source: str | None = None
    event_type: str | None = None  # the provider's, when the body was read (its audit record names it)


class Reroute(NamedTuple):
    """A record that belongs to another partition."""

    key: str
    partition: int
    source: str


class Accepted(NamedTuple):
    """A record ready for the dedupe decision."""

    key: str
    key_bytes: bytes
    source: Source
    event_type: str | None
    body: bytes  # a JSON object: checked, not built

    def event(self) -> Mapping[str, Any]:
        """The body as a parsed document, built on first need (a route's effect key, an older fingerprint)."""
        return providers.parse_body(self.body, self.source.provider)


Classified = Invalid | Reroute | Accepted


class ClassifierFactory(Protocol):
    """What builds a worker's classifier (:class:`Classifier` itself; a test passes a faulty one)."""

    def __call__(self, topology: Topology, partitioner: Partitioner, *, input_partitions: int) -> Classifier:
        """The classifier of ``topology`` over ``input_partitions`` input partitions."""
        ...


class Classifier:
    """Classifies records of one topology; holds the provider presets and secrets."""

    def __init__(
        self,
        topology: Topology,
        partitioner: Partitioner,
        *,
        input_partitions: int,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.partitioner = partitioner
        self.input_partitions = input_partitions
        self._providers: dict[str, Provider] = {
            name: providers.get(source.provider, **source.options)
            for name, source in topology.sources.items()
        }
        self._secrets = {name: source_secrets(source, environ) for name, source in topology.sources.items()}
        self._prefixes = {name: f"{name}:".encode() for name in topology.sources}

    def provider(self, source: str) -> Provider:
        """The preset serving ``source``."""
        return self._providers[source]

    def classify(self, delivery: Delivery) -> Classified:
        """Decide what kind of record ``delivery`` is (see the module docstring)."""
        try:
            return self._classify(delivery)
        except InvalidRecordError as exc:
            key = delivery.key.decode("utf-8", "replace") if delivery.key else None
            return Invalid(reason=exc.reason, error=str(exc), key=key, source=delivery.source)

    def _classify(self, delivery: Delivery) -> Classified:
        source_name = delivery.source
        if source_name is None:
            raise UnknownSourceError("the 'source' header is missing")
        source = self.topology.sources.get(source_name)
        if source is None:
            raise UnknownSourceError(f"source {source_name!r} is not in the topology")
        provider = self._providers[source_name]
        http = delivery.http_headers()
        if source.verify is Verify.WORKER:
            provider.verify(http, delivery.value, self._secrets[source_name], now=delivery.received_at / 1000)
            key, key_bytes = self._verified_key(delivery, source_name, provider, http)
        else:
            key, key_bytes = self._scoped_key(delivery, source_name, provider, http)
        owner = self.partitioner(key_bytes, self.input_partitions)
        if owner != delivery.partition:
            return Reroute(key=key, partition=owner, source=source_name)
        providers.check_body(delivery.value, source.provider)
        return Accepted(key, key_bytes, source, provider.event_type(http, delivery.value), delivery.value)

    @staticmethod
    def _verified_key(
        delivery: Delivery, source: str, provider: Provider, http: Mapping[str, str]
    ) -> tuple[str, bytes]:
        """The key of a request verified in the worker: its own event id, never the producer's word.

        Called only after ``provider.verify`` passed. The record key, else the
        ``idempotency-key`` header, must name the same key (a keyless record takes it);
        KeyMismatchError otherwise. No fast path: a scoped record key is compared, not trusted.
        """
        event_id = provider.idempotency_key(http, delivery.value).strip()
        if not event_id:
            raise MissingKeyError("the verified request's event id is empty")
        key = f"{source}:{event_id}"
        claimed = Classifier._claimed_key(delivery, source)
        if claimed is not None and claimed != key:
            raise KeyMismatchError(
                f"the record key {_shown(claimed)} is not the verified request's key {_shown(key)}"
            )
        return key, key.encode("utf-8", "replace")

    @staticmethod
    def _claimed_key(delivery: Delivery, source: str) -> str | None:
        """The scoped key the producer gave (record key, else ``idempotency-key`` header), or None."""
        raw = delivery.key.decode("utf-8", "replace").strip() if delivery.key else ""
        if not raw:
            raw = delivery.headers.get(IDEMPOTENCY_KEY_HEADER, "").strip()
        if not raw:
            return None
        return raw if raw.startswith(f"{source}:") else f"{source}:{raw}"

    def _scoped_key(
        self, delivery: Delivery, source: str, provider: Provider, http: Mapping[str, str]
    ) -> tuple[str, bytes]:
        """The key as text and bytes; a record key that is already scoped is used as it is.

        Only for sources not verified in the worker (see :meth:`_verified_key`).
        """
        raw = delivery.key
        prefix = self._prefixes[source]
        if raw and len(raw) > len(prefix) and raw.startswith(prefix):
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                text = ""  # the general path decodes with replacement
            if text and not text[-1].isspace():
                return text, raw
        key = self._key(delivery, source, provider, http)
        return key, key.encode()

    @staticmethod
    def _key(delivery: Delivery, source: str, provider: Provider, http: Mapping[str, str]) -> str:
        raw = delivery.key.decode("utf-8", "replace").strip() if delivery.key else ""
        if not raw:
            raw = delivery.headers.get(IDEMPOTENCY_KEY_HEADER, "").strip()
        if not raw:
            raw = provider.idempotency_key(http, delivery.value).strip()
        if not raw or raw == f"{source}:":
            raise MissingKeyError("the record has no key, no idempotency-key header and no provider event id")
        return raw if raw.startswith(f"{source}:") else f"{source}:{raw}"


def _shown(key: str, limit: int = 120) -> str:
    """``key`` quoted and bounded for an error message."""
    return repr(key[:limit]) + ("…" if len(key) > limit else "")
