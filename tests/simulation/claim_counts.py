"""Every claim counts the copies its window decided: what ``pipeline inspect`` reports of a key.

A claim (:class:`~pipeline.state.decision.Entry`) counts the duplicates of its key decided since
its first copy, and of them the conflicts (another body under the key): ``decide`` adds one to
each. Nothing the worker decides reads the counts; only the operator's key report shows them, so a
claim that miscounted passed every other rule (the expiry kind's ledger against seeds 0-299: the
count left out, ``- 1``, ``+ 2``, the conflicts left out or never counted; five survivors).

A window of a key is named by its first copy's place (the claim's ``partition`` and ``offset``: a
redrive can claim a key again, after its TTL, with the same old timestamp). Each accepted copy's
audit record commits in the transaction of the claim it wrote: a ``first`` opens its key's window,
and each ``duplicate`` or ``conflict`` after it, in the order they were appended, counts in it. So
the highest count among a window's committed claims (a rescale copies a key's claims to the new
changelogs, where later copies count on) is its number of duplicate and conflict audit records,
and its conflicts the number of conflicts. A window with no claim left (retention deleted its
segments) is not judged. And the first copy a claim names (``pipeline inspect``: "first seen at")
is a committed first copy of its key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from tests.simulation.changelog_entries import Claimed

MAX_PROBLEMS = 5
COUNTED = ("duplicate", "conflict")

Window = tuple[bool, str, int, int]  # (of the effect stage, key, its first copy's partition and offset)


def problems(
    audits: Iterable[tuple[int, int, int, dict[str, Any]]],
    claims: Iterable[Claimed],
) -> list[str]:
    """``audits``: (appended, partition, offset, value) of each committed audit record; ``claims``: the
    changelogs' committed claims. The windows whose claims count otherwise than their audit
    records, or name a first copy where none of the key is, as problems."""
    duplicates: Counter[Window] = Counter()
    conflicts: Counter[Window] = Counter()
    open_window: dict[tuple[bool, str], Window] = {}
    opened: set[Window] = set()
    for _appended, _partition, _offset, audit in sorted(audits, key=lambda a: a[:3]):
        outcome = audit.get("outcome")
        stage_key = (audit.get("stage") == "effect", str(audit.get("key")))
        if outcome == "first":
            open_window[stage_key] = (*stage_key, int(audit["partition"]), int(audit["offset"]))
            opened.add(open_window[stage_key])
        elif outcome in COUNTED and stage_key in open_window:
            window = open_window[stage_key]
            duplicates[window] += 1
            conflicts[window] += outcome == "conflict"
    counted: dict[Window, tuple[int, int, str]] = {}  # the highest (duplicates, conflicts) and where
    for claim in claims:
        entry = claim.entry
        window = (claim.effect_keyed, claim.key, entry.partition, entry.offset)
        if window not in counted or (entry.duplicates, entry.conflicts) > counted[window][:2]:
            counted[window] = (entry.duplicates, entry.conflicts, claim.where)
    found: list[str] = []
    for window, (dups, conf, where) in sorted(counted.items()):
        if window not in opened:
            found.append(
                f"{window[1]}: its claim at {where} names its first copy at partition {window[2]} offset "
                f"{window[3]}, where no committed first copy of it is (what pipeline inspect shows)"
            )
        elif (dups, conf) != (duplicates[window], conflicts[window]):
            found.append(
                f"{window[1]}: its claim at {where} (first copy at partition {window[2]} offset {window[3]}) "
                f"counts {dups} duplicates, {conf} conflicts; its window's audit records say {duplicates[window]} "
                f"and {conflicts[window]} (what pipeline inspect shows)"
            )
            if len(found) >= MAX_PROBLEMS:
                break
    return found
