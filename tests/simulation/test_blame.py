"""The refusal oracle's rules (tests/simulation/blame.py): which records of a refused batch are blamed, and when a
record dead-lettered ``unproducible`` or restamped did not earn it."""

from __future__ import annotations

import orjson

from tests.simulation import blame
from tests.simulation.records import Record, decode_produced, plain_batch

HOUR = 3_600_000


def _batch(*records: tuple[bytes, bytes, int]) -> object:
    [produced] = decode_produced(plain_batch([(k, v, [], ts) for k, v, ts in records]))
    return produced


def _refused(kind: str, *records: tuple[bytes, bytes, int], limit: int = 1000) -> list[bytes | None]:
    found = blame.refused("t", _batch(*records), kind, limit=limit, outside=lambda ts: ts > 5_000)  # type: ignore[arg-type]
    return [r.record.key for r in found]


def test_a_batch_refused_for_size_blames_the_records_too_large_alone() -> None:
    """Of a batch over the limit, only the record that alone exceeds it is blamed."""
    assert _refused(blame.SIZE, (b"small", b"x" * 10, 0), (b"big", b"x" * 990, 0)) == [b"big"]


def test_a_batch_refused_for_size_that_no_record_fills_alone_blames_none_of_several_keys() -> None:
    """Small records of different keys, too large only together: none is blamed (a worker that splits them
    commits each)."""
    assert _refused(blame.SIZE, (b"a", b"x" * 400, 0), (b"b", b"x" * 400, 0), limit=700) == []


def test_a_batch_refused_for_size_of_one_key_blames_all_its_records() -> None:
    """The outputs of one consumed record may be too large only together: all of them are blamed."""
    assert _refused(blame.SIZE, (b"a", b"x" * 400, 0), (b"a", b"y" * 400, 0), limit=700) == [b"a", b"a"]


def test_a_batch_refused_for_its_timestamp_blames_the_records_outside_the_bounds() -> None:
    """Only the records whose timestamp the broker refuses are blamed."""
    assert _refused(blame.TIMESTAMP, (b"now", b"v", 1_000), (b"ahead", b"v", 9_000)) == [b"ahead"]


def _refusal(topic: str, key: bytes | None, value: bytes, timestamp: int, kind: str) -> blame.Refusal:
    return blame.Refusal(topic, Record(0, timestamp, key, value, ()), kind)


def _blame(*refusals: blame.Refusal) -> blame.Blame:
    return blame.Blame.of(refusals, audit="audit", dlq="dlq", effects="effects", consumed="input")


def test_a_record_none_of_whose_outputs_was_refused_did_not_earn_unproducible() -> None:
    """A record dead-lettered ``unproducible`` with no refusal of its key or position is a wrong isolation."""
    found = _blame(_refusal("commands", b"k2", b"{}", 0, blame.SIZE))
    assert found.problem(("input", 0, 7), ["k1"]) == "the broker refused none of its outputs"
    assert found.problem(("input", 0, 8), ["k2"]) is None


def test_an_audit_record_refused_names_its_consumed_record_by_position() -> None:
    """An audit record of the effect stage names an effects-topic record; a DLQ record names its topic."""
    audit = orjson.dumps({"stage": "effect", "partition": 1, "offset": 4})
    dead = orjson.dumps({"topic": "input", "partition": 2, "offset": 9})
    found = _blame(_refusal("audit", None, audit, 0, blame.SIZE), _refusal("dlq", None, dead, 0, blame.SIZE))
    assert found.problem(("effects", 1, 4), []) is None
    assert found.problem(("input", 2, 9), []) is None
    assert found.problem(("input", 1, 4), []) is not None


def test_a_record_refused_only_for_one_timestamp_was_never_restamped() -> None:
    """Refusals all for the same timestamp: the record went to the DLQ without the redo stamped now; with a second
    timestamp refused too, it had that redo."""
    once = _blame(_refusal("commands", b"k", b"{}", 9_000, blame.TIMESTAMP))
    assert once.problem(("input", 0, 0), ["k"]) == (
        "its outputs were refused for their timestamp, and never redone stamped with another"
    )
    twice = _blame(
        _refusal("commands", b"k", b"{}", 9_000, blame.TIMESTAMP),
        _refusal("commands", b"k", b"{}", 7_000, blame.TIMESTAMP),
    )
    assert twice.problem(("input", 0, 0), ["k"]) is None
    assert twice.for_timestamp(("input", 0, 0), ["k"])
    assert not _blame(_refusal("commands", b"k", b"{}", 0, blame.SIZE)).for_timestamp(("input", 0, 0), ["k"])


def test_a_restamp_is_allowed_for_a_timestamp_ahead_of_the_bound_for_the_least_clock() -> None:
    """An original timestamp within the bound for every worker's clock (minus the slack) was restamped for nothing;
    one beyond it, or before a lower bound, may have been restamped."""
    bounds = blame.Bounds(after=HOUR, before=None, clock=(-60_000, 0))
    appended = 10 * HOUR
    assert not bounds.outside(appended + 10 * 60_000, appended)
    assert bounds.outside(appended + HOUR, appended)
    lower = blame.Bounds(after=HOUR, before=2 * HOUR, clock=(0, 0))
    assert lower.outside(appended - 2 * HOUR, appended)
    assert not lower.outside(appended - HOUR, appended)
