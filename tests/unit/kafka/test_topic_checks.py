"""The topic configs a worker refuses to start on (``pipeline/kafka/topic_checks.py``): each rule, and what passes."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.kafka.admin import topic_specs
from pipeline.kafka.topic_checks import refused_configs
from pipeline.topology import Topology, parse

DAY_MS = 86_400_000


def topology(*, effects: bool = False) -> Topology:
    """A 2-day TTL (its changelog needs 3 days); with ``effects``, an effect TTL of 30 days (31 needed)."""
    route: dict[str, Any] = {
        "source": "stripe",
        "event": "invoice.*",
        "topic": "shop.invoices",
        "command": "close",
    }
    if effects:
        route |= {"effect_key": "data.object.id", "effect_ttl": "30d"}
    return parse(
        {
            "app": {"name": "shop"},
            "topics": {
                "input": "shop.in",
                "commands": "shop.commands",
                "audit": "shop.audit",
                "dlq": "shop.dlq",
            },
            "sources": {"stripe": {"provider": "stripe", "secrets": ["S"], "ttl": "2d"}},
            "routes": [route],
        }
    )


def created(topo: Topology) -> dict[str, dict[str, str]]:
    """Every topic's configs as ``pipeline topics create`` makes them."""
    return {spec.name: dict(spec.configs) for spec in topic_specs(topo)}


def message(topo: Topology, configs: dict[str, dict[str, str]]) -> str:
    refusal = refused_configs(topo, configs)
    assert refusal is not None
    return str(refusal)


@pytest.mark.parametrize("effects", [False, True])
def test_the_topics_as_pipeline_topics_create_makes_them_pass(effects: bool) -> None:
    """Nothing to refuse in the configs the pipeline itself sets."""
    topo = topology(effects=effects)
    assert refused_configs(topo, created(topo)) is None


def test_configs_not_described_are_not_judged() -> None:
    """No configs at all (a broker that described none): nothing is refused on a guess."""
    assert refused_configs(topology(effects=True), {}) is None


@pytest.mark.parametrize("topic", ["shop.audit", "shop.dlq"])
@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_a_compacted_audit_or_dlq_topic_is_refused(topic: str, policy: str) -> None:
    """Compaction in any form on the audit or DLQ topic: refused, naming the topic, the policy and the fix."""
    topo = topology()
    configs = created(topo)
    configs[topic]["cleanup.policy"] = policy
    assert message(topo, configs).startswith(
        f"topic {topic} has cleanup.policy={policy}: the worker writes the audit and DLQ records of a keyless"
    )


def test_a_changelog_kept_less_than_the_largest_ttl_plus_a_day_is_refused() -> None:
    """A day short (a TTL raised without `pipeline topics create`): the changelog, both durations and the fix."""
    topo = topology()
    configs = created(topo)
    configs["shop-seen-changelog"]["retention.ms"] = str(3 * DAY_MS - 1)
    assert message(topo, configs) == (
        "changelog shop-seen-changelog has retention.ms=259199999 (3 days), shorter than the largest TTL plus a day"
        " (3 days): the broker would delete claims still live, and a store rebuilt from the changelog would take"
        " their next copies for first (a second command); run `pipeline topics create` (it sets retention.ms), or"
        " raise it by hand"
    )


def test_the_effect_changelog_is_held_to_the_largest_ttl_of_all() -> None:
    """The effect changelog at the broker's default 7 days under a 30-day effect TTL: refused in hours below two days."""
    topo = topology(effects=True)
    configs = created(topo)
    configs["shop-effects-changelog"]["retention.ms"] = str(DAY_MS + DAY_MS // 2)
    assert message(topo, configs).startswith(
        "changelog shop-effects-changelog has retention.ms=129600000 (36 h), shorter than the largest TTL plus a"
        " day (31 days): "
    )


@pytest.mark.parametrize("retention", [str(3 * DAY_MS), str(400 * DAY_MS), "-1"])
def test_a_changelog_kept_as_long_or_longer_or_for_ever_passes(retention: str) -> None:
    """Exactly the TTL plus a day, an operator's raise for an outage, or never deleted by time."""
    topo = topology()
    configs = created(topo)
    configs["shop-seen-changelog"]["retention.ms"] = retention
    assert refused_configs(topo, configs) is None


def test_a_changelog_deleted_by_size_is_refused() -> None:
    """Any retention.bytes but -1 (a broker-wide log.retention.bytes): refused, naming the bytes and the fix."""
    topo = topology()
    configs = created(topo)
    configs["shop-seen-changelog"]["retention.bytes"] = "1073741824"
    assert message(topo, configs).startswith(
        "changelog shop-seen-changelog has retention.bytes=1073741824: the broker deletes a partition's oldest"
    )
    assert message(topo, configs).endswith("set it to -1 (`pipeline topics create` does)")


def test_a_changelog_only_compacted_deletes_nothing_and_passes() -> None:
    """cleanup.policy=compact: neither retention applies, so neither is judged."""
    topo = topology()
    configs = created(topo)
    configs["shop-seen-changelog"] |= {
        "cleanup.policy": "compact",
        "retention.ms": "1000",
        "retention.bytes": "5",
    }
    assert refused_configs(topo, configs) is None


def test_a_changelog_with_no_policy_described_is_taken_as_deleted() -> None:
    """The broker's default policy is delete: a short retention without a described policy is refused."""
    topo = topology()
    configs = {"shop-seen-changelog": {"retention.ms": "1000"}}
    assert message(topo, configs).startswith("changelog shop-seen-changelog has retention.ms=1000 (1 s)")
