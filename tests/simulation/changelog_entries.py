"""The committed claims of the changelogs, each decoded once, for the rules that read them after a run.

The claim rules (``claim_names``: the command a claim names; ``claim_counts``: the copies it
counts) each judge every committed claim. The oracle decodes the changelogs once, here, and hands
both the same list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.state.decision import Entry


@dataclass(frozen=True)
class Claimed:
    """A committed claim: the changelog and offset it is at, whether it is the effect stage's, its key, its entry."""

    changelog: str
    offset: int
    effect_keyed: bool
    key: str
    entry: Entry

    @property
    def where(self) -> str:
        """``changelog@offset``, as the rules' problems name a claim."""
        return f"{self.changelog}@{self.offset}"


def decode(changelogs: Iterable[tuple[str, bool, Iterable[Any]]]) -> list[Claimed]:
    """``changelogs``: (name, keyed by the effect key, its committed records). Every claim, in the order given;
    tombstones (an expired claim) are left out."""
    return [
        Claimed(name, record.offset, effect_keyed, record.key.decode(), Entry.decode(record.value))
        for name, effect_keyed, records in changelogs
        for record in records
        if record.value is not None and record.key is not None
    ]
