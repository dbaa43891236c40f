"""Reading bodies: the fast check and field reads agree with orjson on what a JSON object is."""

from __future__ import annotations

import contextlib

import orjson
import pytest

from pipeline.errors import BodyError
from pipeline.providers import _body

EVENT = (
    b'{"id": "evt_1", "type": "a.b", "n": 7, "data": {"object": {"id": "pi_1", "list": [1, {"x": null}]}}}'
)

# what orjson takes (and so must be taken) although simdjson refuses it
TAKEN_ONLY_BY_ORJSON = [
    b'{"id": "evt_1", "type": "a.b", "big": 18446744073709551616}',  # beyond 64 bits
    b'{"id": "evt_1", "type": "a.b", "big": -9223372036854775809}',
]
# what orjson refuses (and so must be refused) although simdjson would read it
REFUSED_ONLY_BY_ORJSON = [b'\xef\xbb\xbf{"id": "evt_1", "type": "a.b"}']  # a byte-order mark
NOT_OBJECTS = [b"[]", b'[{"id": "evt_1"}]', b"1", b'"evt_1"', b"null", b"true"]
MALFORMED = [
    b"",
    b"   ",
    b'{"id": "evt_1"',
    b'{"id": "evt_1"} x',
    b'{"id": "evt_1",}',
    b'{"id": NaN}',
    b'{"id": 1e400}',
    b'{"id": "\xff"}',
    b'{"id": "\\ud800"}',
    b'{"id": "a\x01"}',
    b'{"id": "evt_1"}\x00',
    b'{"a": ' * 1100 + b"1" + b"}" * 1100,
]


def _orjson_message(body: bytes) -> str:
    with pytest.raises(BodyError) as refused:
        _body.parse_object(body, "p")
    return str(refused.value)


@pytest.mark.parametrize("body", [EVENT, *TAKEN_ONLY_BY_ORJSON])
def test_a_json_object_passes_the_check_and_its_fields_are_read(body: bytes) -> None:
    """Every body orjson parses to an object is taken, and its fields read as orjson reads them."""
    _body.check_object(body, "p")
    document = orjson.loads(body)
    for path in ("id", "type", "big", "n", "data", "data.object", "data.object.list", "data.object.id"):
        assert _body.value_at(body, path, "p") == _body.lookup(document, path)


@pytest.mark.parametrize("body", REFUSED_ONLY_BY_ORJSON + NOT_OBJECTS + MALFORMED)
def test_a_body_orjson_refuses_or_that_is_not_an_object_is_refused_with_orjsons_message(body: bytes) -> None:
    """The check, the field reads and the full parse refuse the same bodies with the same message."""
    message = _orjson_message(body)
    with pytest.raises(BodyError) as checked:
        _body.check_object(body, "p")
    assert str(checked.value) == message
    with pytest.raises(BodyError) as read:
        _body.value_at(body, "id", "p")
    assert str(read.value) == message


def test_absent_paths_and_paths_through_non_objects_are_missing() -> None:
    """A path that is absent, or runs through a list or a scalar, finds nothing."""
    for path in ("nope", "id.x", "data.object.list.0", "data.nope.id", "n.x"):
        assert _body.is_missing(_body.value_at(EVENT, path, "p"))
    assert _body.value_at(EVENT, "data.object.list", "p") == [1, {"x": None}]


def test_reads_of_interleaved_bodies_each_see_their_own_body() -> None:
    """A body read after another is parsed afresh, and a body read again is not confused with the last."""
    other = b'{"id": "evt_2", "type": "c.d"}'
    for _ in range(3):
        assert _body.value_at(EVENT, "id", "p") == "evt_1"
        assert _body.value_at(other, "id", "p") == "evt_2"
        assert _body.value_at(EVENT, "data.object.id", "p") == "pi_1"
        assert _body.value_at(TAKEN_ONLY_BY_ORJSON[0], "big", "p") == 2**64
        assert _body.value_at(other, "type", "p") == "c.d"


@pytest.mark.parametrize("between", [MALFORMED[-1], MALFORMED[2], NOT_OBJECTS[0], TAKEN_ONLY_BY_ORJSON[1]])
def test_a_body_simdjson_refuses_in_between_leaves_later_reads_working(between: bytes) -> None:
    """A deep, malformed, non-object or big-integer body (some make simdjson start a new parser) breaks no later read."""
    assert _body.value_at(bytes(EVENT), "type", "p") == "a.b"
    with contextlib.suppress(BodyError):
        _body.value_at(between, "id", "p")
    assert _body.value_at(bytes(bytearray(EVENT)), "data.object.id", "p") == "pi_1"


def test_a_field_holding_an_object_is_handed_out_as_a_plain_copy() -> None:
    """Reading a nested object gives a dict that outlives the next body's parse."""
    nested = _body.value_at(EVENT, "data", "p")
    assert _body.value_at(b'{"id": "evt_2"}', "id", "p") == "evt_2"
    assert nested == {"object": {"id": "pi_1", "list": [1, {"x": None}]}}


def test_a_body_beyond_the_simdjson_limit_is_read_by_orjson_so_the_parser_stays_small() -> None:
    """A large body is checked and read all the same, without passing through simdjson's parser."""
    filler = b"x" * (_body.SIMDJSON_MAX_BYTES + 1)
    large = b'{"id": "evt_big", "type": "a.b", "pad": "' + filler + b'"}'
    _body.check_object(large, "p")
    assert _body.value_at(large, "id", "p") == "evt_big"
    assert _body._CHECKED.body is not large
    with pytest.raises(BodyError):
        _body.check_object(large[:-1], "p")


def test_a_body_already_parsed_whole_is_not_parsed_again_by_the_check() -> None:
    """After ``parse_object`` (a key hashed from body fields), the check reuses that parse: simdjson never takes the body."""
    _body.check_object(b'{"other": 1}', "p")  # simdjson holds another body
    body = bytes(bytearray(EVENT))
    _body.parse_object(body, "p")
    _body.check_object(body, "p")
    assert _body._CHECKED.body is not body
    fresh = bytes(bytearray(EVENT))  # equal bytes, another object: not parsed yet, so simdjson takes it
    _body.check_object(fresh, "p")
    assert _body._CHECKED.body is fresh
