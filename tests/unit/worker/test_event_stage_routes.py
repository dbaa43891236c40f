"""The event stage's routes (stripe-fulfilment topology): commands sent through the effects topic with their
effect key, TTL and command topic; events without a value at their effect key sent to the DLQ; events dropped
on purpose; and the per-(source, event type) cache of routes and their targets."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER
from pipeline.kafka.partitioner import owner_partition
from pipeline.kafka.record_size import RECORD_OVERHEAD, record_size
from pipeline.state.decision import Outcome
from pipeline.topology import Route, Topology
from pipeline.worker import event_stage as event_stage_module
from pipeline.worker.classify import Accepted
from pipeline.worker.event_stage import Target

from .event_world import SHOP, EventWorld, build_event_world, shop_record
from .fakes import PARTITIONS, T0, keys_for

TOPICS = SHOP.topics
K = keys_for(0, 8)  # owned by input partition 0: never rerouted
THIRTY_DAYS_MS = 30 * 86_400_000  # the fulfil-order routes' effect_ttl
SEVEN_DAYS_MS = 7 * 86_400_000  # the stripe source's ttl


def _effects(world: EventWorld) -> list[tuple[int, bytes | None, dict[str, bytes | None], dict[str, Any]]]:
    """The committed effects-topic records: (partition, key, headers, command JSON)."""
    return [(s.partition, s.key, dict(s.headers), s.json()) for s in world.sent(TOPICS.effects)]


def _commands_anywhere(world: EventWorld) -> list[bytes | None]:
    """The keys of every committed record on a command topic or the effects topic."""
    topics = {*SHOP.command_topics(), TOPICS.effects}
    return [s.key for s in world.producer.committed if s.topic in topics]


async def test_an_effect_routed_event_sends_its_command_to_the_effects_topic_keyed_by_its_effect_key() -> (
    None
):
    """checkout.session.completed: a fulfil-order command keyed fulfil-order:<payment intent>, placed by that
    key, with the route's 30-day effect TTL in ms and its command topic as headers; the audit names the effect key."""
    world = build_event_world(SHOP)
    await world.run([shop_record(3, K[0], "checkout.session.completed", payment_intent="pi_1")])
    effect_key = b"fulfil-order:pi_1"
    assert _effects(world) == [
        (
            owner_partition(effect_key, PARTITIONS),
            effect_key,
            {EFFECT_TTL_HEADER: str(THIRTY_DAYS_MS).encode(), COMMAND_TOPIC_HEADER: b"shop.orders"},
            {
                "command": "fulfil-order",
                "key": K[0],
                "effect_key": "fulfil-order:pi_1",
                "source": "stripe",
                "event_type": "checkout.session.completed",
                "received_at": T0 + 3,
                "event": {
                    "id": K[0].split(":", 1)[1],
                    "type": "checkout.session.completed",
                    "object": "event",
                    "data": {"object": {"payment_intent": "pi_1"}},
                },
            },
        )
    ]
    assert world.sent("shop.orders") == []  # the effect stage forwards it, once per effect key
    assert world.audit() == [
        {
            "key": K[0],
            "outcome": "first",
            "partition": 0,
            "offset": 3,
            "received_at": T0 + 3,
            "first_seen_at": T0 + 3,
            "source": "stripe",
            "event_type": "checkout.session.completed",
            "expires_at": T0 + 3 + SEVEN_DAYS_MS,
            "effect_key": "fulfil-order:pi_1",
        }
    ]
    assert world.recorder.commands == []  # counted by the effect stage, which emits the command itself
    assert world.recorder.outcomes == {("stripe", Outcome.FIRST): 1}


async def test_an_effect_route_without_effect_ttl_keeps_its_effect_for_the_sources_ttl() -> None:
    """invoice.paid names no effect_ttl: its effects record carries the stripe source's 7 days, in ms."""
    world = build_event_world(SHOP)
    await world.run([shop_record(3, K[0], "invoice.paid", id="in_1")])
    ((_, key, headers, command),) = _effects(world)
    assert key == b"close-invoice:in_1"
    assert headers == {EFFECT_TTL_HEADER: str(SEVEN_DAYS_MS).encode(), COMMAND_TOPIC_HEADER: b"shop.invoices"}
    assert (command["command"], command["effect_key"]) == ("close-invoice", "close-invoice:in_1")


async def test_an_effect_route_without_a_topic_names_the_topologys_command_topic() -> None:
    """A route with an effect key but no topic: its effects record is bound for the topology's command topic."""
    route = Route(source="stripe", event="invoice.paid", command="close-invoice", effect_key="data.object.id")
    world = build_event_world(dataclasses.replace(SHOP, routes=(route,)))
    await world.run([shop_record(3, K[0], "invoice.paid", id="in_1")])
    ((_, key, headers, _),) = _effects(world)
    assert key == b"close-invoice:in_1"
    assert headers[COMMAND_TOPIC_HEADER] == TOPICS.commands.encode()


async def test_an_event_without_a_value_at_its_effect_key_goes_to_the_dlq_as_missing_effect_key() -> None:
    """No data.object.payment_intent: DLQ record and invalid audit with the reason, the path, the key and the
    event type; its key is not claimed and nothing reaches a command topic, so a fixed copy redriven later is a first."""
    world = build_event_world(SHOP)
    await world.run([shop_record(4, K[0], "checkout.session.completed", amount=100)])
    (dlq,) = world.dlq()
    assert {k: dlq[k] for k in ("reason", "error", "topic", "partition", "offset", "key")} == {
        "reason": "missing-effect-key",
        "error": "the event has no value at effect_key 'data.object.payment_intent'",
        "topic": TOPICS.input,
        "partition": 0,
        "offset": 4,
        "key": K[0],
    }
    assert world.audit() == [
        {
            "key": K[0],
            "outcome": "invalid",
            "partition": 0,
            "offset": 4,
            "received_at": T0 + 4,
            "first_seen_at": None,
            "source": "stripe",
            "event_type": "checkout.session.completed",
            "expires_at": None,
            "reason": "missing-effect-key",
        }
    ]
    assert _commands_anywhere(world) == []
    assert world.store.entries == {}
    assert world.recorder.dlqs == ["missing-effect-key"]
    assert world.recorder.outcomes == {("stripe", "invalid"): 1}


async def test_an_event_dropped_by_its_route_is_claimed_and_audited_as_dropped_without_a_command() -> None:
    """customer.created meets the catch-all drop route: its key is claimed with no command or topic, and the
    audit says dropped_by_route; no command topic and no effects record sees it."""
    world = build_event_world(SHOP)
    await world.run([shop_record(3, K[0], "customer.created", id="cus_1")])
    assert _commands_anywhere(world) == []
    (audit,) = world.audit()
    assert (audit["outcome"], audit["dropped_by_route"], "effect_key" in audit) == ("first", True, False)
    claim = world.store.entries[K[0].encode()]
    assert (claim.command, claim.topic) == (None, None)
    assert world.recorder.commands == []


class _CountingTopology:
    """A topology that notes each route lookup (the stage asks nothing else of it that matters here)."""

    def __init__(self, inner: Topology) -> None:
        self.inner = inner
        self.lookups: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def route(self, source: str, event_type: str | None) -> Route | None:
        self.lookups.append((source, event_type))
        return self.inner.route(source, event_type)


def _counting_resolve(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Note the event pattern of the route of each target the stage resolves."""
    resolved: list[str | None] = []
    resolve = event_stage_module.resolve_target

    def counting(topology: Topology, route: Route | None, item: Accepted) -> Target | None:
        resolved.append(route.event if route is not None else None)
        return resolve(topology, route, item)

    monkeypatch.setattr(event_stage_module, "resolve_target", counting)
    return resolved


async def test_a_route_is_looked_up_once_per_source_and_event_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three events of one type and two of another, over two batches: two route lookups; the dropped type's
    target is resolved once, the effect route's once per event (its effect key is in each event)."""
    counting = _CountingTopology(SHOP)
    world = build_event_world(cast("Topology", counting))
    resolved = _counting_resolve(monkeypatch)
    await world.run(
        [
            shop_record(1, K[0], "customer.created"),
            shop_record(2, K[1], "invoice.paid", id="in_1"),
            shop_record(3, K[2], "customer.created"),
        ]
    )
    await world.run(
        [shop_record(4, K[3], "customer.created"), shop_record(5, K[4], "invoice.paid", id="in_2")]
    )
    assert counting.lookups == [("stripe", "customer.created"), ("stripe", "invoice.paid")]
    assert resolved == ["*", "invoice.paid", "invoice.paid"]
    assert [a["outcome"] for a in world.audit()] == ["first"] * 5


async def test_the_route_cache_once_full_is_emptied_before_it_takes_another_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for two (source, event type) pairs, a third empties it: the first type is looked up again."""
    monkeypatch.setattr(event_stage_module, "ROUTE_CACHE_SIZE", 2)
    counting = _CountingTopology(SHOP)
    world = build_event_world(cast("Topology", counting))
    types = ["customer.created", "customer.updated", "customer.deleted", "customer.created"]
    await world.run([shop_record(i, K[i], t) for i, t in enumerate(types)])
    assert [t for _, t in counting.lookups] == types


async def test_a_command_for_the_effect_stage_must_fit_its_command_topic_key_included() -> None:
    """The effect stage forwards the command as it is: one that fits shop.orders only without its key counted
    goes to the DLQ as too-large naming shop.orders, audited invalid under its event key, source and type."""
    probe = build_event_world(SHOP)
    event = shop_record(3, K[0], "checkout.session.completed", payment_intent="pi_1")
    await probe.run([event])
    ((_, key, _, _),) = _effects(probe)
    (sent,) = probe.sent(TOPICS.effects)
    exact = RECORD_OVERHEAD + len(sent.value) + len(key or b"")

    fits = build_event_world(SHOP, limits={"shop.orders": exact})
    await fits.run([event])
    assert len(fits.sent(TOPICS.effects)) == 1

    world = build_event_world(SHOP, limits={"shop.orders": exact - 1})
    await world.run([event])
    assert _commands_anywhere(world) == []
    (dlq,) = world.dlq()
    assert (dlq["reason"], dlq["error"]) == (
        "too-large",
        f"its command of {len(sent.value)} bytes is larger than shop.orders takes",
    )
    (audit,) = world.audit()
    assert {k: audit[k] for k in ("key", "outcome", "source", "event_type", "reason")} == {
        "key": K[0],
        "outcome": "invalid",
        "source": "stripe",
        "event_type": "checkout.session.completed",
        "reason": "too-large",
    }
    assert world.store.entries == {}


async def test_a_command_for_the_effect_stage_must_fit_the_effects_topic_headers_included() -> None:
    """The effects-topic record carries the effect TTL and command topic headers: one that fits the effects topic
    only without them counted goes to the DLQ as too-large naming the effects topic, and nothing is claimed."""
    probe = build_event_world(SHOP)
    event = shop_record(3, K[0], "checkout.session.completed", payment_intent="pi_1")
    await probe.run([event])
    (sent,) = probe.sent(TOPICS.effects)
    exact = record_size(sent.key, sent.value, list(sent.headers))

    fits = build_event_world(SHOP, limits={TOPICS.effects: exact})
    await fits.run([event])
    assert len(fits.sent(TOPICS.effects)) == 1

    world = build_event_world(SHOP, limits={TOPICS.effects: exact - 1})
    await world.run([event])
    assert _commands_anywhere(world) == []
    (dlq,) = world.dlq()
    assert (dlq["reason"], dlq["error"]) == (
        "too-large",
        f"its command of {len(sent.value)} bytes is larger than {TOPICS.effects} takes",
    )
    assert world.store.entries == {}
