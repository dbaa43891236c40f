"""What a record sent to the DLQ says of itself (the error an operator reads), and a source's provider options."""

from __future__ import annotations

import orjson
import pytest

from pipeline import topology
from pipeline.contract import Delivery
from pipeline.kafka.partitioner import owner_partition
from pipeline.worker.classify import Accepted, Classifier, Invalid

PARTS = 4
TOPO = topology.parse(
    {
        "sources": {
            "stripe": {"verify": "none"},
            "shop": {"provider": "generic", "verify": "none", "options": {"key_path": "order.id"}},
        }
    }
)
BODY = orjson.dumps({"id": "evt_1", "type": "charge.succeeded"})


def _delivery(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], partition: int = 0
) -> Delivery:
    return Delivery.from_record("raw", partition, 1, 1_700_000_000_000, key, value, headers)


@pytest.fixture
def classifier() -> Classifier:
    return Classifier(TOPO, owner_partition, input_partitions=PARTS, environ={})


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([], "the 'source' header is missing"),
        ([("source", b"gitlab")], "source 'gitlab' is not in the topology"),
    ],
)
def test_a_record_of_no_known_source_says_which_source_it_lacks(
    classifier: Classifier, headers: list[tuple[str, bytes]], error: str
) -> None:
    """No source header, or one the topology lacks: unknown-source, and the error says which."""
    key = b"stripe:evt_1"
    result = classifier.classify(_delivery(key, BODY, headers, owner_partition(key, PARTS)))
    assert result == Invalid(
        reason="unknown-source",
        error=error,
        key="stripe:evt_1",
        source=headers[0][1].decode() if headers else None,
    )


def test_a_body_that_is_not_json_is_refused_naming_its_provider(classifier: Classifier) -> None:
    """A scoped record key, a body that is not JSON: bad-body, the error naming the source's provider."""
    key = b"stripe:evt_1"
    result = classifier.classify(
        _delivery(key, b"not json", [("source", b"stripe")], owner_partition(key, PARTS))
    )
    assert isinstance(result, Invalid)
    assert result.reason == "bad-body"
    assert result.error.startswith("stripe body is not valid JSON: ")


def test_a_source_is_keyed_as_its_provider_options_say(classifier: Classifier) -> None:
    """A generic source configured with ``key_path``: a keyless record takes its key from that body field."""
    body = orjson.dumps({"order": {"id": "o-7"}})
    result = classifier.classify(
        _delivery(None, body, [("source", b"shop")], owner_partition(b"shop:o-7", PARTS))
    )
    assert isinstance(result, Accepted)
    assert result.key == "shop:o-7"
