"""Every claim names the command its key made: what ``pipeline inspect`` reports of a key.

A claim (:class:`~pipeline.state.decision.Entry`) keeps the command its key's first copy made and
that command's topic, and every later copy keeps them (``decide``). Nothing the worker decides reads
them: only the operator's key report (``pipeline inspect``, the worker's ``/keys/{key}``) shows
them, so a claim that forgot them passed every other rule (the expiry kind's mutation run against
seeds 0-299: ``command=None``, ``topic=None``, the arguments left out, on a first copy and on a
duplicate; six survivors). This rule reads every committed claim of the changelogs after the run:
a key that has command records names, in each of its claims, one of their (command, topic) pairs;
the event stage's claims by the event key (a command's ``key``), the effect stage's by the effect
key (its ``effect_key``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from tests.simulation.changelog_entries import Claimed

MAX_PROBLEMS = 5

Named = tuple[str | None, str | None]  # (command, topic)


def problems(commands: Iterable[tuple[str, Any]], claims: Iterable[Claimed]) -> list[str]:
    """``commands``: (topic, record) of each committed command; ``claims``: the changelogs' committed claims.
    The claims that name no command their key made, as problems."""
    by_event: dict[str, set[Named]] = {}
    by_effect: dict[str, set[Named]] = {}
    for topic, record in commands:
        value = orjson.loads(record.value)
        named = (value.get("command"), topic)
        by_event.setdefault(str(value.get("key")), set()).add(named)
        by_effect.setdefault(str(value.get("effect_key") or value.get("key")), set()).add(named)
    found: list[str] = []
    for claim in claims:
        made = (by_effect if claim.effect_keyed else by_event).get(claim.key)
        if not made:
            continue  # no command of this key reached a topic (dead-lettered, refused, a route without one)
        entry = claim.entry
        if (entry.command, entry.topic) not in made:
            found.append(
                f"{claim.key}: its claim at {claim.where} names command {entry.command!r} of topic "
                f"{entry.topic!r}, but its commands are {sorted(made, key=str)} (what pipeline inspect shows)"
            )
            if len(found) >= MAX_PROBLEMS:
                return found
    return found
