"""The rule that every claim names its key's command (``claim_names.py``), on records made by hand."""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.state.decision import Entry
from tests.simulation import changelog_entries
from tests.simulation.claim_names import problems as _problems
from tests.simulation.records import Record


def problems(commands: Any, changelogs: Any) -> list[str]:
    """The rule's problems, the changelogs given as (name, keyed by the effect key, records) as the oracle reads them."""
    return _problems(commands, changelog_entries.decode(changelogs))


def _command(key: str, command: str, effect_key: str | None = None) -> Record:
    value = {"command": command, "key": key} | ({"effect_key": effect_key} if effect_key else {})
    return Record(0, 0, key.encode(), orjson.dumps(value), ())


def _claim(key: str, offset: int, command: str | None, topic: str | None) -> Record:
    entry = Entry(1, 2, 0, offset, command=command, topic=topic)
    return Record(offset, 0, key.encode(), entry.encode(), ())


def test_a_claim_naming_its_keys_command_passes_and_one_naming_none_fails() -> None:
    """The first claim names ("handle", "cmds"), the duplicate's claim None: only the second is a problem."""
    found = problems(
        [("cmds", _command("k1", "handle"))],
        [("log", False, [_claim("k1", 0, "handle", "cmds"), _claim("k1", 1, None, "cmds")])],
    )
    assert found == [
        (
            "k1: its claim at log@1 names command None of topic 'cmds', but its commands are "
            "[('handle', 'cmds')] (what pipeline inspect shows)"
        )
    ]


def test_tombstones_and_keys_without_commands_are_not_judged() -> None:
    """An expired claim's tombstone, and a key no command of which reached a topic, say nothing."""
    tombstone = Record(3, 0, b"k1", None, ())
    found = problems(
        [("cmds", _command("k1", "handle"))], [("log", False, [tombstone, _claim("k2", 4, None, None)])]
    )
    assert found == []


def test_the_effects_changelog_is_judged_by_the_effect_key() -> None:
    """An effect stage's claim is keyed by the effect key: matched to the commands' effect_key, not their key."""
    commands = [("orders", _command("evt_1", "fulfil", effect_key="order_9"))]
    assert problems(commands, [("effects-log", True, [_claim("order_9", 0, "fulfil", "orders")])]) == []
    assert len(problems(commands, [("effects-log", True, [_claim("order_9", 0, "fulfil", "other")])])) == 1
