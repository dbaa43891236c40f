"""The restore's fast read of ``expires_at`` out of an encoded entry, and its fallback."""

from __future__ import annotations

import orjson
import pytest

from pipeline.state.decision import Entry
from pipeline.state.restore import expires_at


def test_expires_at_is_read_from_an_encoded_entry() -> None:
    """The scan finds the same value a full decode does, strings with commas and quotes included."""
    entry = Entry(1, 604_800_001, 2, 3, 4, 5, command='cmd "x":9, ,', topic="t", body_hash="h")
    assert expires_at(entry.encode()) == 604_800_001


def test_an_entry_in_another_field_order_falls_back_to_decoding() -> None:
    """A value whose first "x": is not followed by digits and a comma is decoded instead."""
    value = orjson.dumps({"c": '"x":oops', "f": 1, "x": 77, "p": 0, "o": 0})
    assert expires_at(value) == 77
    assert expires_at(orjson.dumps({"f": 1, "p": 0, "o": 0, "x": 88})) == 88


def test_a_value_that_is_not_an_entry_raises_value_error() -> None:
    """Garbage in the changelog is reported, not stored under a made-up bucket."""
    with pytest.raises(ValueError, match="not a seen-set entry"):
        expires_at(b"not json")
