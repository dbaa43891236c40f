"""The rule that every claim counts its window's copies (``claim_counts.py``), on records made by hand."""

from __future__ import annotations

from typing import Any

from pipeline.state.decision import Entry
from tests.simulation import changelog_entries
from tests.simulation.claim_counts import problems as _problems
from tests.simulation.records import Record


def problems(audits: Any, changelogs: Any) -> list[str]:
    """The rule's problems, the changelogs given as (name, keyed by the effect key, records) as the oracle reads them."""
    return _problems(audits, changelog_entries.decode(changelogs))


def _audit(
    appended: int, outcome: str, offset: int, key: str = "k1", **extra: Any
) -> tuple[int, int, int, Any]:
    return (
        appended,
        0,
        appended,
        {"key": key, "outcome": outcome, "partition": 0, "offset": offset, **extra},
    )


def _claim(offset: int, first: int, duplicates: int, conflicts: int = 0, key: str = "k1") -> Record:
    entry = Entry(1, 2, 0, first, duplicates=duplicates, conflicts=conflicts)
    return Record(offset, 0, key.encode(), entry.encode(), ())


def test_a_claim_counting_its_windows_copies_passes_and_one_short_fails() -> None:
    """A first copy, a duplicate and a conflict: the last claim must count 2 and 1; counting 1 is a problem."""
    audits = [_audit(1, "first", 10), _audit(2, "duplicate", 11), _audit(3, "conflict", 12)]
    right = [_claim(0, 10, 0), _claim(1, 10, 1), _claim(2, 10, 2, 1)]
    assert problems(audits, [("log", False, right)]) == []
    short = [_claim(0, 10, 0), _claim(1, 10, 1), _claim(2, 10, 1, 1)]
    assert problems(audits, [("log", False, short)]) == [
        (
            "k1: its claim at log@2 (first copy at partition 0 offset 10) counts 1 duplicates, 1 conflicts; its "
            "window's audit records say 2 and 1 (what pipeline inspect shows)"
        )
    ]


def test_a_conflict_left_uncounted_fails() -> None:
    """Two copies, the second with another body: a claim counting the duplicate but not the conflict fails."""
    audits = [_audit(1, "first", 10), _audit(2, "conflict", 11)]
    assert len(problems(audits, [("log", False, [_claim(0, 10, 0), _claim(1, 10, 1, 0)])])) == 1


def test_a_key_claimed_again_after_its_ttl_counts_from_zero_in_its_new_window() -> None:
    """A redrive claims the key again with its old timestamp: the new window (another first copy) counts alone."""
    audits = [
        _audit(1, "first", 10),
        _audit(2, "duplicate", 11),
        _audit(5, "first", 30),
        _audit(6, "duplicate", 31),
    ]
    claims = [
        _claim(0, 10, 0),
        _claim(1, 10, 1),
        Record(2, 0, b"k1", None, ()),
        _claim(3, 30, 0),
        _claim(4, 30, 1),
    ]
    assert problems(audits, [("log", False, claims)]) == []


def test_what_is_not_a_decision_counts_nothing_and_stages_count_apart() -> None:
    """Invalid and rerouted copies count nothing; the effect stage's audit records count its own claims only."""
    audits = [
        _audit(1, "first", 10),
        _audit(2, "invalid", 11),
        _audit(3, "rerouted", 12),
        _audit(4, "first", 7, stage="effect"),
        _audit(5, "duplicate", 8, stage="effect"),
    ]
    assert problems(audits, [("log", False, [_claim(0, 10, 0)]), ("effects", True, [_claim(0, 7, 1)])]) == []
    assert len(problems(audits, [("log", False, [_claim(0, 10, 1)])])) == 1


def test_a_claim_naming_a_first_copy_that_is_none_of_its_keys_fails() -> None:
    """A claim whose first copy is not where a committed first copy of its key is: the key report would point
    the operator at another record."""
    audits = [_audit(1, "first", 10)]
    assert problems(audits, [("log", False, [_claim(0, 10, 0)])]) == []
    assert problems(audits, [("log", False, [_claim(0, 11, 0)])]) == [
        (
            "k1: its claim at log@0 names its first copy at partition 0 offset 11, where no committed first copy "
            "of it is (what pipeline inspect shows)"
        )
    ]
