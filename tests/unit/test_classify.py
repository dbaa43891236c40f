"""Classifying input records: DLQ reasons, key derivation, rerouting and worker-side verification."""

from __future__ import annotations

import orjson
import pytest

from pipeline import topology
from pipeline.contract import Delivery
from pipeline.kafka import owner_partition
from pipeline.providers.signing import sign
from pipeline.worker.classify import Accepted, Classifier, Invalid, Reroute

PARTS = 4
SECRET = "whsec_test_secret"
TOPO = topology.parse(
    {
        "sources": {
            "stripe": {"verify": "none"},
            "github": {"secrets": ["GH_SECRET"], "verify": "worker"},
        }
    }
)


@pytest.fixture
def classifier() -> Classifier:
    return Classifier(TOPO, owner_partition, input_partitions=PARTS, environ={"GH_SECRET": SECRET})


def _delivery(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], partition: int | None = None
) -> Delivery:
    if partition is None:
        partition = owner_partition(key, PARTS) if key else 0
    return Delivery.from_record("raw", partition, 1, 1_700_000_000_000, key, value, headers)


STRIPE = [("source", b"stripe")]
BODY = orjson.dumps({"id": "evt_1", "type": "charge.succeeded", "data": {"object": {"id": "ch_1"}}})


def test_a_well_formed_record_is_accepted_with_its_event_type(classifier: Classifier) -> None:
    """A keyed record on its own partition is accepted, parsed and typed."""
    result = classifier.classify(_delivery(b"stripe:evt_1", BODY, STRIPE))
    assert isinstance(result, Accepted)
    assert result.key == "stripe:evt_1"
    assert result.event_type == "charge.succeeded"


@pytest.mark.parametrize(
    ("key", "value", "headers", "reason"),
    [
        (b"stripe:evt_1", BODY, [], "unknown-source"),
        (b"gitlab:1", BODY, [("source", b"gitlab")], "unknown-source"),
        (None, b'{"no": "id"}', STRIPE, "missing-key"),
        (b"stripe:evt_1", b"not json", STRIPE, "bad-body"),
        (b"stripe:evt_1", b"[1, 2]", STRIPE, "bad-body"),
    ],
)
def test_unusable_records_are_invalid_with_a_reason(
    classifier: Classifier, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], reason: str
) -> None:
    """No source, an unknown source, no key and a non-object body each get their DLQ reason."""
    result = classifier.classify(_delivery(key, value, headers))
    assert isinstance(result, Invalid)
    assert result.reason == reason
    assert result.error


def test_a_keyless_record_takes_its_key_from_the_header_then_the_provider(classifier: Classifier) -> None:
    """The idempotency-key header wins over the provider's event id; both are scoped by source."""
    owner = owner_partition(b"stripe:evt_1", PARTS)
    from_body = classifier.classify(_delivery(None, BODY, STRIPE, partition=owner))
    assert isinstance(from_body, Accepted)
    assert from_body.key == "stripe:evt_1"
    header_key = b"stripe:custom"
    from_header = classifier.classify(
        _delivery(
            None,
            BODY,
            [*STRIPE, ("idempotency-key", b"custom")],
            partition=owner_partition(header_key, PARTS),
        )
    )
    assert isinstance(from_header, Accepted)
    assert from_header.key == "stripe:custom"


def test_a_record_on_the_wrong_partition_is_rerouted_to_its_owner(classifier: Classifier) -> None:
    """A key that hashes elsewhere (murmur2) is moved, not deduped here."""
    owner = owner_partition(b"stripe:evt_1", PARTS)
    result = classifier.classify(_delivery(b"stripe:evt_1", BODY, STRIPE, partition=(owner + 1) % PARTS))
    assert result == Reroute(key="stripe:evt_1", partition=owner, source="stripe")


def test_an_unscoped_key_is_prefixed_with_its_source(classifier: Classifier) -> None:
    """A raw provider id as record key is scoped to '<source>:<id>'."""
    result = classifier.classify(
        _delivery(b"evt_1", BODY, STRIPE, partition=owner_partition(b"stripe:evt_1", PARTS))
    )
    assert isinstance(result, Accepted)
    assert result.key == "stripe:evt_1"


@pytest.mark.parametrize(
    ("record_key", "key"),
    [
        (b"stripe:evt_1", "stripe:evt_1"),
        (b"  stripe:evt_1\n", "stripe:evt_1"),
        ("stripe:evt_1\u2003".encode(), "stripe:evt_1"),  # Unicode whitespace is stripped too
        (b"stripe:evt_\xff", "stripe:evt_\ufffd"),  # not UTF-8: decoded with replacement
        (b"stripe:", None),  # a scope without an id: the DLQ, not the provider's id
    ],
)
def test_record_keys_are_stripped_and_decoded_the_same_way_on_every_path(
    classifier: Classifier, record_key: bytes, key: str | None
) -> None:
    """Whitespace around a record key never makes a second key for one event, however it is spelled."""
    partition = owner_partition(key.encode(), PARTS) if key else 0
    result = classifier.classify(_delivery(record_key, BODY, STRIPE, partition=partition))
    if key is None:
        assert isinstance(result, Invalid)
        assert result.reason == "missing-key"
        return
    assert isinstance(result, Accepted)
    assert result.key == key
    assert result.key_bytes == key.encode()


def _github(body: bytes, secret: str, received_at_ms: int) -> list[tuple[str, bytes]]:
    signed = sign("github", body, secret, timestamp=received_at_ms / 1000, msg_id="d-1", event_type="push")
    headers = [("source", b"github"), ("received-at", str(received_at_ms).encode())]
    return headers + [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]


def test_worker_side_verification_accepts_a_good_signature(classifier: Classifier) -> None:
    """A source verified in the worker accepts a correctly signed record."""
    body = b'{"ref": "refs/heads/main"}'
    result = classifier.classify(_delivery(b"github:d-1", body, _github(body, SECRET, 1_700_000_000_000)))
    assert isinstance(result, Accepted)


def test_worker_side_verification_sends_forgeries_to_the_dlq(classifier: Classifier) -> None:
    """A forged record is invalid with the signature reason and is never accepted."""
    body = b'{"ref": "refs/heads/main"}'
    result = classifier.classify(
        _delivery(b"github:d-1", body, _github(body, "wrong-secret", 1_700_000_000_000))
    )
    assert isinstance(result, Invalid)
    assert result.reason == "bad-signature"
