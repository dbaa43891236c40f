"""Topologies load into frozen objects, and every mistake is reported with file, key and reason."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from pipeline import topology
from pipeline.errors import TopologyError

ROOT = Path(__file__).resolve().parents[2]


def test_default_topology_loads() -> None:
    """topologies/default.toml is valid and names the contract's topics."""
    topo = topology.load(ROOT / "topologies" / "default.toml")
    assert topo.topics.input == "webhooks.raw"
    assert topo.topics.commands == "webhooks.events"
    assert topo.sources["stripe"].ttl == timedelta(days=7)
    assert topo.sources["stripe"].expiry is topology.Expiry.FIXED


def test_topology_objects_are_frozen() -> None:
    """A loaded topology cannot be changed after validation."""
    topo = topology.parse({"sources": {"github": {"secrets": ["GH"]}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.topics.partitions = 3  # type: ignore[misc]


def test_every_problem_is_reported_at_once() -> None:
    """One error lists each bad key with the reason, and names the origin."""
    data = {
        "topics": {"partitions": 0, "input": "bad topic!"},
        "sources": {
            "stripe": {"provider": "nope", "ttl": "forever", "expiry": "whenever", "colour": "red"},
        },
        "routes": [
            {"source": "gitlab", "drop": True, "topic": "x"},
            {"source": "stripe", "effect_key": "data..id", "effect_ttl": "2d"},
            {"source": "stripe", "effect_key": "data.object.id"},
        ],
    }
    with pytest.raises(TopologyError) as caught:
        topology.parse(data, origin="t.toml")
    problems = caught.value.problems
    expected = [
        "t.toml: topics.partitions: must be a positive integer",
        "t.toml: topics.input: must be a Kafka topic name",
        "t.toml: sources.stripe.provider: unknown provider 'nope'",
        "t.toml: sources.stripe.ttl: expected a duration",
        "t.toml: sources.stripe.expiry: must be one of: fixed, sliding",
        "t.toml: sources.stripe.colour: unknown key",
        "t.toml: routes[0].source: 'gitlab' matches no source",
        "t.toml: routes[0]: a route with drop = true takes no topic, command or effect_key",
        "t.toml: routes[1].effect_key: must be a dotted path",
        "t.toml: routes[1].effect_ttl: needs an effect_key",
        "t.toml: routes[2].command: a route with an effect_key needs a command name",
    ]
    for fragment in expected:
        assert any(p.startswith(fragment) for p in problems), (fragment, problems)


def test_a_verified_source_needs_a_secret() -> None:
    """verify = 'ingress' without secret variables is refused; verify = 'none' is the explicit opt-out."""
    with pytest.raises(TopologyError, match=r"sources.github.secrets: verify = 'ingress' needs"):
        topology.parse({"sources": {"github": {}}})
    topo = topology.parse({"sources": {"github": {"verify": "none"}}})
    assert topo.sources["github"].verify is topology.Verify.NONE


def test_missing_and_malformed_files_are_topology_errors(tmp_path: Path) -> None:
    """A missing file and bad TOML give a TopologyError naming the file."""
    with pytest.raises(TopologyError, match="file not found"):
        topology.load(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sources\n")
    with pytest.raises(TopologyError, match=r"bad.toml: not valid TOML"):
        topology.load(bad)


def test_changelog_retention_is_the_largest_ttl_plus_a_margin() -> None:
    """retention.ms for the changelog covers the longest-lived key."""
    topo = topology.parse(
        {
            "sources": {
                "a": {"provider": "github", "verify": "none", "ttl": "2d"},
                "b": {"provider": "stripe", "verify": "none", "ttl": "10d"},
            }
        }
    )
    assert topo.changelog_retention == timedelta(days=11)


def test_routes_pick_the_first_match_or_the_default_topic() -> None:
    """Events take the first matching route; unmatched ones go to the default command topic."""
    topo = topology.parse(
        {
            "sources": {"github": {"verify": "none"}},
            "routes": [
                {"source": "github", "event": "push", "topic": "git.pushes", "command": "build"},
                {"source": "github", "event": "ping", "drop": True},
            ],
        }
    )
    route = topo.route("github", "push")
    assert route is not None
    assert route.topic == "git.pushes"
    dropped = topo.route("github", "ping")
    assert dropped is not None
    assert dropped.drop
    assert topo.route("github", "issues.opened") is None
    assert topo.command_topics() == ["git.pushes", "webhooks.events"]


@pytest.mark.parametrize("name", ["default", "stripe-fulfilment", "github"])
def test_every_example_topology_loads(name: str) -> None:
    """The topologies shipped in topologies/ are valid."""
    topo = topology.load(ROOT / "topologies" / f"{name}.toml")
    assert topo.sources


def test_effect_keys_resolve_dotted_paths_in_the_event() -> None:
    """An effect key path picks a string or integer from the event, and nothing else."""
    route = topology.Route(effect_key="data.object.payment_intent", command="fulfil-order")
    assert route.effect_value({"data": {"object": {"payment_intent": "pi_1"}}}) == "pi_1"
    assert route.effect_value({"data": {"object": {"payment_intent": 7}}}) == "7"
    assert route.effect_value({"data": {"object": {"payment_intent": None}}}) is None
    assert route.effect_value({"data": {}}) is None


def test_effect_ttls_count_towards_the_changelog_retention() -> None:
    """A longer effect TTL than any source TTL sets the changelog retention."""
    topo = topology.load(ROOT / "topologies" / "stripe-fulfilment.toml")
    assert topo.has_effects
    assert topo.changelog_retention == timedelta(days=31)


def test_the_redrive_history_topic_is_named_by_the_app_and_distinct() -> None:
    """``topics.redrives`` defaults to ``<app>-redrives`` and may not reuse another topic's name."""
    topo = topology.parse({"app": {"name": "shop"}, "sources": {"github": {"verify": "none"}}})
    assert topo.topics.redrives == "shop-redrives"
    with pytest.raises(TopologyError, match="redrives topics must be distinct"):
        topology.parse({"topics": {"redrives": "webhooks.dlq"}, "sources": {"github": {"verify": "none"}}})
