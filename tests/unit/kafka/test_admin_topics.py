"""Topic administration against a fake broker: what is created, checked, restored and refused, and every message."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError

from pipeline.errors import BrokerUnavailableError, ConfigError, PipelineError
from pipeline.kafka import admin
from pipeline.kafka.admin import (
    NO_LIMIT_MS,
    TopicResult,
    TopicSpec,
    check_bootstrap,
    describe_topic_configs,
    ensure_topics,
    partition_count,
    redrive_history_spec,
    require_topic,
    topic_specs,
    until_served,
)
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.kafka.topic_layout import TopicLayout, timestamp_bounds, topic_layout
from pipeline.topology import Topology, parse
from tests.unit.kafka.admin_fakes import LEADER_NOT_AVAILABLE, Created, FakeBroker, FakeClock

BOOT = "kafka.test:9092"
LONG_MAX = "9223372036854775807"  # Kafka's Long.MAX_VALUE: no bound
MAX = str(MAX_MESSAGE_BYTES)
RESCALE_FIX = "(workers stopped: it moves the keys; a changelog needs as many partitions as its input)"

MakeBroker = Callable[..., FakeBroker]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The clock ``pipeline.kafka.admin`` polls by: its sleeps return at once and are recorded."""
    found = FakeClock()
    monkeypatch.setattr(admin, "asyncio", found)
    return found


@pytest.fixture
def make_broker(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> MakeBroker:
    """A factory of fake brokers: the one made last is the one ``AIOKafkaAdminClient`` reaches."""

    def make(**options: Any) -> FakeBroker:
        broker = FakeBroker(**options)
        monkeypatch.setattr(admin, "AIOKafkaAdminClient", broker.client)
        return broker

    return make


def shop(*, effects: bool = False) -> Topology:
    """A topology of 3 partitions, replication 2, a 2-day TTL and two routed command topics; with
    ``effects``, one route passes the effect stage with a 30-day effect TTL."""
    routes: list[dict[str, Any]] = [
        {"source": "stripe", "event": "order.*", "topic": "shop.orders", "command": "fulfil"},
        {"source": "stripe", "event": "invoice.*", "topic": "shop.invoices", "command": "close"},
    ]
    if effects:
        routes[1] |= {"effect_key": "data.object.id", "effect_ttl": "30d"}
    topics = {"input": "shop.in", "commands": "shop.commands", "audit": "shop.audit", "dlq": "shop.dlq"}
    return parse(
        {
            "app": {"name": "shop"},
            "topics": topics | {"partitions": 3, "replication": 2},
            "sources": {"stripe": {"provider": "stripe", "secrets": ["STRIPE_SECRET"], "ttl": "2d"}},
            "routes": routes,
        }
    )


SHOP_NAMES = [
    "shop.in",
    "shop.audit",
    "shop.dlq",
    "shop-seen-changelog",
    "shop.commands",
    "shop.invoices",
    "shop.orders",
]
EFFECT_NAMES = ["shop-effects", "shop-effects-changelog"]


def serve(broker: FakeBroker, names: list[str], partitions: int = 3) -> None:
    """Make every topic of ``names`` exist with ``partitions``."""
    for name in names:
        broker.add(name, partitions)


async def refused(error: type[Exception], call: Any) -> str:
    """The message of the ``error`` that awaiting ``call`` raises."""
    with pytest.raises(error) as caught:
        await call
    return str(caught.value)


# -- check_bootstrap --------------------------------------------------------------------------------


@pytest.mark.parametrize("bootstrap", ["a:1,b:65535", "kafka:9092", " a:1 , b:2 ", "[::1]:9092"])
def test_a_comma_separated_list_of_host_and_port_is_accepted(bootstrap: str) -> None:
    """Every entry with a host and a port from 1 to 65535 passes, spaces around entries allowed."""
    check_bootstrap(bootstrap)


@pytest.mark.parametrize(
    ("bootstrap", "entry"), [("127.0.0.1", "127.0.0.1"), ("a:1, b ", "b"), ("localhost", "localhost")]
)
def test_a_host_without_a_port_is_refused_with_an_example_of_the_fix(bootstrap: str, entry: str) -> None:
    """A bare host is not given 9092 silently: the message names the entry and shows it with :9092."""
    with pytest.raises(ConfigError) as caught:
        check_bootstrap(bootstrap)
    assert str(caught.value) == (
        f"bootstrap servers {bootstrap!r}: {entry!r} has no port; give host:port (e.g. {entry}:9092)"
    )


@pytest.mark.parametrize(
    ("bootstrap", "entry"),
    [
        ("a:0", "a:0"),
        ("a:65536", "a:65536"),
        ("a:x9", "a:x9"),
        ("a:-1", "a:-1"),
        ("a:", "a:"),
        (":9092", ":9092"),
        (" :9092", ":9092"),
        ("a:1,,b:2", ""),
        ("a:1, ", ""),
        ("", ""),
    ],
)
def test_an_entry_without_a_host_and_a_port_from_1_to_65535_is_refused(bootstrap: str, entry: str) -> None:
    """Port 0, 65536, a non-number, no host and an empty entry are each "not host:port", naming the entry."""
    with pytest.raises(ConfigError) as caught:
        check_bootstrap(bootstrap)
    assert str(caught.value) == f"bootstrap servers {bootstrap!r}: {entry!r} is not host:port"


# -- admin_client -----------------------------------------------------------------------------------


async def test_the_admin_client_is_made_for_the_bootstrap_with_its_timeout_in_ms_and_closed_after(
    make_broker: MakeBroker,
) -> None:
    """The client gets the bootstrap and the timeout as request_timeout_ms, is started, and closed once on exit."""
    broker = make_broker()
    async with admin.admin_client(BOOT, timeout=2.5) as client:
        assert client is broker.clients[0]
        assert broker.clients[0].started
        assert broker.clients[0].closed == 0
    assert broker.clients[0].kwargs == {"bootstrap_servers": BOOT, "request_timeout_ms": 2500}
    assert broker.clients[0].closed == 1


async def test_the_admin_clients_default_timeout_is_ten_seconds(make_broker: MakeBroker) -> None:
    """Without a timeout, requests may take 10 s."""
    broker = make_broker()
    async with admin.admin_client(BOOT):
        pass
    assert broker.clients[0].kwargs["request_timeout_ms"] == 10_000


async def test_a_bootstrap_without_a_port_is_refused_before_any_client_is_made(
    make_broker: MakeBroker,
) -> None:
    """check_bootstrap runs first: no connection is tried to a guessed port."""
    broker = make_broker()
    with pytest.raises(ConfigError, match="has no port"):
        async with admin.admin_client("kafka.test"):
            pass
    assert broker.clients == []


@pytest.mark.parametrize(
    "error", [KafkaConnectionError("Unable to bootstrap"), OSError("Connect call failed")]
)
async def test_a_start_that_fails_is_broker_unavailable_and_closes_the_client(
    make_broker: MakeBroker, error: Exception
) -> None:
    """A refused connection at start is a BrokerUnavailableError naming the bootstrap and why; the client is closed."""
    broker = make_broker(start_error=error)
    with pytest.raises(BrokerUnavailableError) as caught:
        async with admin.admin_client(BOOT):
            pytest.fail("the body ran without a started client")
    assert str(caught.value) == f"cannot reach Kafka at {BOOT}: {error}"
    assert caught.value.__cause__ is None
    assert broker.clients[0].closed == 1


async def test_a_start_that_never_answers_is_broker_unavailable_after_the_timeout(
    make_broker: MakeBroker,
) -> None:
    """A start that hangs is given up after ``timeout`` seconds, as BrokerUnavailableError, and the client closed."""
    broker = make_broker(start_hangs=True)
    async with asyncio.timeout(2):  # the test's own bound: it fails rather than hangs
        with pytest.raises(BrokerUnavailableError) as caught:
            async with admin.admin_client(BOOT, timeout=0.01):
                pytest.fail("the body ran without a started client")
    assert str(caught.value) == f"cannot reach Kafka at {BOOT}: no answer within 0.01s"
    assert broker.clients[0].closed == 1


@pytest.mark.parametrize("error", [ValueError("a bug"), asyncio.CancelledError()])
async def test_a_start_failing_otherwise_closes_the_client_and_raises_as_it_is(
    make_broker: MakeBroker, error: BaseException
) -> None:
    """An error that is not the broker being away (or the caller's cancellation) passes through, and the client
    that was being started is closed behind it."""
    broker = make_broker(start_error=error)
    with pytest.raises(type(error)):
        async with admin.admin_client(BOOT):
            pytest.fail("the body ran without a started client")
    assert broker.clients[0].closed == 1


@pytest.mark.parametrize(
    "error",
    [
        KafkaConnectionError("closed"),
        NodeNotReadyError("node 1"),
        RequestTimedOutError("slow"),
        KafkaTimeoutError("late"),
    ],
)
async def test_each_error_of_a_broker_gone_while_in_use_is_broker_unavailable(
    make_broker: MakeBroker, error: Exception
) -> None:
    """Connection, node, request and client timeouts while the client is used say "lost Kafka" with the error."""
    broker = make_broker()
    with pytest.raises(BrokerUnavailableError) as caught:
        async with admin.admin_client(BOOT):
            raise error
    assert str(caught.value) == f"lost Kafka at {BOOT}: {error!r}"
    assert broker.clients[0].closed == 1


async def test_a_request_given_up_by_its_timeout_while_in_use_is_broker_unavailable(
    make_broker: MakeBroker,
) -> None:
    """A request aiokafka's admin gives up on (the builtin TimeoutError of its request timeout, as when the broker
    goes away mid-request) says "lost Kafka", so ``pipeline rescale`` ends in one line (seed redrive:60090)."""
    broker = make_broker()
    with pytest.raises(BrokerUnavailableError) as caught:
        async with admin.admin_client(BOOT, timeout=4.0):
            raise TimeoutError
    assert str(caught.value) == f"lost Kafka at {BOOT}: no answer within 4s"
    assert broker.clients[0].closed == 1


async def test_another_error_while_in_use_passes_through_and_the_client_is_closed(
    make_broker: MakeBroker,
) -> None:
    """An error that is not the broker going away is not turned into BrokerUnavailableError."""
    broker = make_broker()
    with pytest.raises(ValueError, match="mine"):
        async with admin.admin_client(BOOT):
            raise ValueError("mine")
    assert broker.clients[0].closed == 1


# -- topic_specs, redrive_history_spec --------------------------------------------------------------


def test_the_specs_are_every_topic_of_the_topology_with_its_count_replication_and_configs() -> None:
    """Input (any timestamp), audit and DLQ (deleted, never compacted), changelog (compacted and deleted after the largest TTL plus a day, never by size)
    and each command topic (sorted), all with the topology's count and replication and the 4 MiB limit;
    no effect topics without an effect route."""
    plain = {"max.message.bytes": MAX}
    three_days_ms = str(3 * 86_400_000)  # the 2-day TTL plus the 1-day margin
    assert topic_specs(shop()) == [
        TopicSpec("shop.in", 3, 2, plain | {"message.timestamp.after.max.ms": LONG_MAX}),
        TopicSpec("shop.audit", 3, 2, plain | {"cleanup.policy": "delete"}),
        TopicSpec("shop.dlq", 3, 2, plain | {"cleanup.policy": "delete"}),
        TopicSpec(
            "shop-seen-changelog",
            3,
            2,
            plain
            | {"cleanup.policy": "compact,delete", "retention.ms": three_days_ms, "retention.bytes": "-1"},
        ),
        TopicSpec("shop.commands", 3, 2, plain),
        TopicSpec("shop.invoices", 3, 2, plain),
        TopicSpec("shop.orders", 3, 2, plain),
    ]


def test_a_topology_with_effects_adds_the_effect_topic_and_its_changelog() -> None:
    """With an effect route: the effect topic (plain) and its changelog (as the first), after the others;
    both changelogs keep the largest TTL, here the 30-day effect TTL, plus a day."""
    plain = {"max.message.bytes": MAX}
    changelog = plain | {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(31 * 86_400_000),
        "retention.bytes": "-1",
    }
    specs = topic_specs(shop(effects=True))
    assert [s.name for s in specs] == SHOP_NAMES + EFFECT_NAMES
    assert specs[3] == TopicSpec("shop-seen-changelog", 3, 2, changelog)
    assert specs[-2:] == [
        TopicSpec("shop-effects", 3, 2, plain),
        TopicSpec("shop-effects-changelog", 3, 2, changelog),
    ]


def test_a_partition_count_given_overrides_the_topologys_for_every_topic() -> None:
    """``topic_specs(topology, 8)`` (rescale, --partitions) asks 8 of every topic, effect topics included."""
    specs = topic_specs(shop(effects=True), 8)
    assert {s.partitions for s in specs} == {8}
    assert len(specs) == 9


def test_the_redrive_history_spec_is_one_compacted_partition_with_the_topologys_replication() -> None:
    """One partition, the topology's replication, compacted (not deleted), the 4 MiB limit."""
    assert redrive_history_spec(shop()) == TopicSpec(
        "shop-redrives", 1, 2, {"max.message.bytes": MAX, "cleanup.policy": "compact"}
    )


# -- timestamp_bounds (the cases test_admin.py leaves) ----------------------------------------------


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        ({"message.timestamp.type": "CreateTime", "message.timestamp.after.max.ms": "1"}, (NO_LIMIT_MS, 1)),
        ({"message.timestamp.after.max.ms": "-1"}, None),  # not a number: no bound
        (
            {
                "message.timestamp.before.max.ms": "",
                "message.timestamp.after.max.ms": "7",
                "message.timestamp.difference.max.ms": "5",
            },
            (5, 7),
        ),  # an empty setting falls back to the older one
        ({"message.timestamp.before.max.ms": LONG_MAX, "message.timestamp.after.max.ms": LONG_MAX}, None),
        (
            {
                "message.timestamp.before.max.ms": LONG_MAX,
                "message.timestamp.after.max.ms": "9223372036854775806",
            },
            (NO_LIMIT_MS, NO_LIMIT_MS - 1),
        ),
    ],
)
def test_timestamp_bounds_read_create_time_empty_and_unbounded_settings(
    configs: dict[str, str], expected: tuple[int, int] | None
) -> None:
    """CreateTime is bounded, a non-number or Long.MAX_VALUE both ways is no bound, an empty key falls back."""
    assert timestamp_bounds(configs) == expected


# -- served_partitions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("described", "expected"),
    [
        ({"topic": "a", "error_code": 0, "partitions": [{}, {}]}, 2),
        ({"topic": "a", "partitions": [{}, {}, {}]}, 3),  # no error code: none
        ({"topic": "a", "error_code": LEADER_NOT_AVAILABLE, "partitions": [{}, {}]}, None),
        ({"topic": "a", "error_code": 3, "partitions": []}, None),
        ({"topic": "a", "error_code": 0, "partitions": []}, None),
        ({"topic": "a", "error_code": 0}, None),
    ],
)
def test_a_topic_is_served_with_its_partitions_only_without_an_error_and_with_partitions(
    described: dict[str, Any], expected: int | None
) -> None:
    """The partition count, or None when the metadata carries an error or no partition."""
    assert admin.served_partitions(described) == expected


# -- until_served ------------------------------------------------------------------------------------


async def test_topics_served_whole_are_waited_for_not_at_all(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """One describe of the wanted topics, no sleep, when each has all its partitions."""
    broker = make_broker()
    serve(broker, ["a", "b", "other"])
    await until_served(broker.client(), {"a": 3, "b": 3}, timeout=1)
    assert broker.described == [["a", "b"]]
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("code", "partitions"),
    [(LEADER_NOT_AVAILABLE, 0), (0, 0), (0, 2), (LEADER_NOT_AVAILABLE, 3)],
)
async def test_a_topic_not_yet_served_whole_is_polled_every_tenth_of_a_second_until_it_is(
    make_broker: MakeBroker, clock: FakeClock, code: int, partitions: int
) -> None:
    """An error, no partition, some partitions, or all of them with an error: not served yet; asked again."""
    broker = make_broker()
    broker.add("a", 3, hidden_for=2, hidden_code=code, hidden_partitions=partitions)
    broker.add("b", 3)
    await until_served(broker.client(), {"a": 3, "b": 3}, timeout=1)
    assert clock.sleeps == [0.1, 0.1]
    assert len(broker.described) == 3


async def test_topics_not_served_after_the_timeout_are_named_sorted(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """After ``timeout`` seconds (asked at 0, 0.1, 0.2 and past 0.2), PipelineError names the unserved, sorted;
    a topic with another count than wanted is not served."""
    broker = make_broker()
    broker.add("b", 3)
    broker.add("a", 4)  # wanted with 3
    message = await refused(
        PipelineError, until_served(broker.client(), {"c": 1, "b": 3, "a": 3}, timeout=0.2)
    )
    assert message == "topics created but not served by the broker after 0.2s: a, c"
    assert len(broker.described) == 4
    assert clock.sleeps == [0.1, 0.1, 0.1]


# -- partition_count, require_topic -------------------------------------------------------------------


async def test_partition_count_is_the_served_count_or_none(make_broker: MakeBroker) -> None:
    """A served topic's count; None for an unknown topic and for one not served yet; each over its own client."""
    broker = make_broker()
    broker.add("a", 4)
    broker.add("hidden", 4, hidden_for=1)
    assert await partition_count(BOOT, "a") == 4
    assert await partition_count(BOOT, "missing") is None
    assert await partition_count(BOOT, "hidden") is None
    assert broker.described == [["a"], ["missing"], ["hidden"]]
    assert [(c.kwargs["request_timeout_ms"], c.closed) for c in broker.clients] == [(10_000, 1)] * 3


async def test_require_topic_answers_a_served_topics_count_at_once(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """One describe, no wait; the client's timeout is the one given."""
    broker = make_broker()
    broker.add("a", 4)
    assert await require_topic(BOOT, "a", timeout=2.5) == 4
    assert broker.described == [["a"]]
    assert clock.sleeps == []
    assert broker.clients[0].kwargs["request_timeout_ms"] == 2500
    assert broker.clients[0].closed == 1


async def test_require_topic_refuses_an_unknown_topic_at_once(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """Error 3 (unknown topic): ConfigError saying to create the topics, after one describe, without waiting."""
    broker = make_broker()
    message = await refused(ConfigError, require_topic(BOOT, "a", timeout=5))
    assert message == "topic a does not exist: run 'pipeline topics create' first"
    assert broker.described == [["a"]]
    assert clock.sleeps == []


async def test_require_topic_waits_for_a_known_topic_until_it_is_served(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """A topic known but not served (just created) is asked again every 0.1 s until it is."""
    broker = make_broker()
    broker.add("a", 4, hidden_for=2)
    assert await require_topic(BOOT, "a", timeout=5) == 4
    assert clock.sleeps == [0.1, 0.1]


async def test_require_topic_gives_up_on_a_known_topic_never_served_after_the_timeout(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """BrokerUnavailableError naming the topic and bootstrap once past the timeout (asked at 0, 0.1, 0.2, 0.3)."""
    broker = make_broker()
    broker.add("a", 4, hidden_for=100)
    message = await refused(BrokerUnavailableError, require_topic(BOOT, "a", timeout=0.2))
    assert message == f"topic a is not served by Kafka at {BOOT} yet"
    assert len(broker.described) == 4
    assert broker.clients[0].closed == 1


async def test_require_topics_default_timeout_is_ten_seconds(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """Without a timeout: requests of 10 s, and a topic never served is waited for 10 s."""
    broker = make_broker()
    broker.add("a", 4, hidden_for=1000)
    await refused(BrokerUnavailableError, require_topic(BOOT, "a"))
    assert broker.clients[0].kwargs["request_timeout_ms"] == 10_000
    assert 10 < clock.now < 10.2


# -- describe_topic_configs ---------------------------------------------------------------------------


async def test_describe_topic_configs_gives_every_key_of_each_topic_defaults_included(
    make_broker: MakeBroker,
) -> None:
    """The broker's defaults and each topic's own settings, per topic, over one closed client."""
    broker = make_broker(defaults={"cleanup.policy": "delete", "retention.ms": "604800000"})
    broker.add("a", 1, {"retention.ms": "1000"})
    broker.add("b", 1, {"segment.ms": "5"})
    assert await describe_topic_configs(BOOT, ["a", "b"]) == {
        "a": {"cleanup.policy": "delete", "retention.ms": "1000"},
        "b": {"cleanup.policy": "delete", "retention.ms": "604800000", "segment.ms": "5"},
    }
    assert broker.config_reads == [["a", "b"]]
    assert broker.clients[0].kwargs["request_timeout_ms"] == 10_000
    assert broker.clients[0].closed == 1


async def test_the_configs_of_a_topic_that_does_not_exist_are_refused_not_read_as_defaults(
    make_broker: MakeBroker,
) -> None:
    """A topic the broker does not know is a ConfigError naming it, not an empty config that reads as defaults."""
    broker = make_broker()
    broker.add("a", 1)
    with pytest.raises(ConfigError, match=r"^topic gone does not exist: run 'pipeline topics create' first$"):
        await describe_topic_configs(BOOT, ["a", "gone"])
    assert broker.clients[0].closed == 1


async def test_configs_the_broker_refuses_to_give_are_an_error_with_its_code_and_message(
    make_broker: MakeBroker,
) -> None:
    """A topic whose configs the broker will not describe (not authorized) fails with the broker's reason."""
    broker = make_broker()
    broker.add("a", 1)
    broker.config_errors["a"] = (29, "not authorized")
    with pytest.raises(
        PipelineError, match=r"^cannot read the configs of topic a: not authorized \(Kafka error 29\)$"
    ):
        await describe_topic_configs(BOOT, ["a"])


# -- ensure_topics -------------------------------------------------------------------------------------

COMPACT = {"cleanup.policy": "compact"}


async def test_missing_topics_are_created_with_their_partitions_replication_and_configs(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """CreateTopics carries each spec as asked and the timeout in ms; nothing is read or altered after."""
    broker = make_broker()
    specs = [TopicSpec("a", 3, 2, COMPACT), TopicSpec("b", 5)]  # replication 1 unless told
    assert await ensure_topics(BOOT, specs, timeout=2.5) == [
        TopicResult("a", "created", 3),
        TopicResult("b", "created", 5),
    ]
    assert broker.created == [Created("a", 3, 2, COMPACT), Created("b", 5, 1, {})]
    assert broker.create_timeouts == [2500]
    assert broker.clients[0].kwargs["request_timeout_ms"] == 2500
    assert broker.described == [None, ["a", "b"]]  # every topic, then the created ones until served
    assert broker.config_reads == []
    assert broker.altered == []
    assert clock.sleeps == []
    assert broker.clients[0].closed == 1


async def test_ensure_topics_default_timeout_is_ten_seconds(make_broker: MakeBroker) -> None:
    """Without a timeout, the create is given 10000 ms."""
    broker = make_broker()
    await ensure_topics(BOOT, [TopicSpec("a", 1)])
    assert broker.create_timeouts == [10_000]


async def test_created_topics_are_reported_only_once_the_broker_serves_them(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """A created topic the broker serves after two more describes is waited for."""
    broker = make_broker(serve_after=2)
    assert await ensure_topics(BOOT, [TopicSpec("a", 3)]) == [TopicResult("a", "created", 3)]
    assert clock.sleeps == [0.1, 0.1]
    assert broker.described == [None, ["a"], ["a"], ["a"]]


async def test_created_topics_never_served_are_an_error_after_the_timeout(make_broker: MakeBroker) -> None:
    """PipelineError naming the created topics the broker does not serve in time."""
    make_broker(serve_after=100)
    message = await refused(
        PipelineError, ensure_topics(BOOT, [TopicSpec("b", 1), TopicSpec("a", 1)], timeout=0.2)
    )
    assert message == "topics created but not served by the broker after 0.2s: a, b"


async def test_existing_topics_with_the_configs_asked_are_left_alone(make_broker: MakeBroker) -> None:
    """ "exists" with their count and no note; only the specs with configs are read; nothing created or altered."""
    broker = make_broker()
    broker.add("a", 3, COMPACT)
    broker.add("b", 3)
    assert await ensure_topics(BOOT, [TopicSpec("a", 3, 1, COMPACT), TopicSpec("b", 3)]) == [
        TopicResult("a", "exists", 3),
        TopicResult("b", "exists", 3),
    ]
    assert broker.create_timeouts == []
    assert broker.config_reads == [["a"]]
    assert broker.altered == []


async def test_only_the_configs_that_differ_are_restored_and_named_sorted_in_the_note(
    make_broker: MakeBroker,
) -> None:
    """IncrementalAlterConfigs sets the keys whose value differs (a default counts as differing), never the
    equal ones; an operator's other settings stay; the note lists the keys restored, sorted."""
    broker = make_broker()
    broker.add("a", 3, {"max.message.bytes": MAX, "retention.ms": "5"})  # an operator's retention
    broker.add("b", 3, {"max.message.bytes": MAX})
    wanted = {"segment.ms": "100", "max.message.bytes": MAX, "cleanup.policy": "compact,delete"}
    specs = [TopicSpec("a", 3, 1, wanted), TopicSpec("b", 3, 1, {"max.message.bytes": MAX})]
    assert await ensure_topics(BOOT, specs) == [
        TopicResult("a", "updated", 3, "restored cleanup.policy=compact,delete, segment.ms=100"),
        TopicResult("b", "exists", 3),
    ]
    assert broker.altered == [{"a": {"cleanup.policy": "compact,delete", "segment.ms": "100"}}]
    assert broker.topics["a"].configs["retention.ms"] == "5"
    assert await ensure_topics(BOOT, specs) == [TopicResult("a", "exists", 3), TopicResult("b", "exists", 3)]
    assert len(broker.altered) == 1  # the second run changed nothing


async def test_created_topics_come_first_in_the_results_then_the_existing_ones(
    make_broker: MakeBroker,
) -> None:
    """Missing topics are created (in spec order), then the existing ones are checked (in spec order)."""
    broker = make_broker()
    broker.add("b", 2)
    broker.add("d", 2, {"cleanup.policy": "delete"})
    specs = [TopicSpec("a", 2), TopicSpec("b", 2), TopicSpec("c", 2), TopicSpec("d", 2, 1, COMPACT)]
    assert await ensure_topics(BOOT, specs) == [
        TopicResult("a", "created", 2),
        TopicResult("c", "created", 2),
        TopicResult("b", "exists", 2),
        TopicResult("d", "updated", 2, "restored cleanup.policy=compact"),
    ]
    assert [c.name for c in broker.created] == ["a", "c"]
    assert broker.config_reads == [["d"]]


async def test_a_topic_another_client_created_first_is_tolerated(make_broker: MakeBroker) -> None:
    """TOPIC_ALREADY_EXISTS (36) for a topic created between the describe and the create is not an error."""
    broker = make_broker(concurrent={"a"})
    assert await ensure_topics(BOOT, [TopicSpec("a", 2), TopicSpec("b", 2)]) == [
        TopicResult("b", "created", 2),
        TopicResult("a", "exists", 2),
    ]
    assert broker.topics["b"].partitions == 2


async def test_a_topic_another_client_created_first_is_waited_for_until_served(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """A topic created meanwhile that the broker serves after two more describes is waited for, then counted."""
    broker = make_broker(concurrent={"a"}, serve_after=2)
    assert await ensure_topics(BOOT, [TopicSpec("a", 2)]) == [TopicResult("a", "exists", 2)]
    assert clock.sleeps == [0.1, 0.1]
    assert broker.described == [None, ["a"], ["a"], ["a"]]


async def test_a_topic_another_client_created_first_never_served_is_an_error_after_the_timeout(
    make_broker: MakeBroker,
) -> None:
    """PipelineError naming the topic another client created that the broker does not serve in time."""
    make_broker(concurrent={"a"}, serve_after=100)
    message = await refused(PipelineError, ensure_topics(BOOT, [TopicSpec("a", 1)], timeout=0.2))
    assert message == "topics created by another client but not served after 0.2s: a"


async def test_a_topic_another_client_created_first_gets_our_configs_restored(
    make_broker: MakeBroker,
) -> None:
    """A topic created meanwhile without the configs we own is reported as updated, with them restored."""
    broker = make_broker(concurrent={"a"}, concurrent_layouts={"a": (2, {})})
    assert await ensure_topics(BOOT, [TopicSpec("a", 2, 1, COMPACT)]) == [
        TopicResult("a", "updated", 2, "restored cleanup.policy=compact"),
    ]
    assert broker.topics["a"].configs == COMPACT


async def test_a_topic_another_client_created_first_with_another_count_is_refused(
    make_broker: MakeBroker,
) -> None:
    """A topic created meanwhile with another partition count is the same ConfigError as one found at the start."""
    broker = make_broker(concurrent={"a"}, concurrent_layouts={"a": (3, {})})
    message = await refused(ConfigError, ensure_topics(BOOT, [TopicSpec("a", 2)]))
    assert message.startswith("partition counts differ from the 2 asked (a has 3)")
    assert broker.altered == []


async def test_a_refused_create_is_an_error_naming_the_topic_the_code_and_the_message(
    make_broker: MakeBroker,
) -> None:
    """Any code but 0 and 36: PipelineError with the broker's code and message; nothing waited for or altered."""
    broker = make_broker(create_errors={"b": (38, "Replication factor: 3 larger than available brokers: 1.")})
    message = await refused(PipelineError, ensure_topics(BOOT, [TopicSpec("a", 1), TopicSpec("b", 1, 3)]))
    assert (
        message == "cannot create topic b: error 38 Replication factor: 3 larger than available brokers: 1."
    )
    assert broker.described == [None]
    assert broker.altered == []


async def test_a_refused_create_without_a_message_names_the_code_alone(make_broker: MakeBroker) -> None:
    """A CreateTopics v0 answer (name, code) has no message: the error ends with the code."""
    make_broker(create_errors={"a": (41, None)}, messages_in_create_errors=False)
    message = await refused(PipelineError, ensure_topics(BOOT, [TopicSpec("a", 1)]))
    assert message == "cannot create topic a: error 41"


async def test_a_refused_create_with_a_null_message_names_the_code_alone(make_broker: MakeBroker) -> None:
    """A CreateTopics v1+ answer whose message is null: the error ends with the code, not "None"."""
    make_broker(create_errors={"a": (41, None)})
    message = await refused(PipelineError, ensure_topics(BOOT, [TopicSpec("a", 1)]))
    assert message == "cannot create topic a: error 41"


async def test_a_refused_config_change_is_an_error_naming_the_topic(make_broker: MakeBroker) -> None:
    """The broker refusing IncrementalAlterConfigs for a topic is a PipelineError with its code and message."""
    broker = make_broker(alter_errors={"a": (40, "Invalid value x for configuration cleanup.policy")})
    broker.add("a", 1)
    message = await refused(
        PipelineError, ensure_topics(BOOT, [TopicSpec("a", 1, 1, {"cleanup.policy": "x"})])
    )
    assert message == (
        "the broker refused to set topic configs: a: error 40 Invalid value x for configuration cleanup.policy"
    )


async def test_a_topic_with_more_partitions_than_asked_is_refused_before_anything_is_created(
    make_broker: MakeBroker,
) -> None:
    """Partitions cannot be removed: ConfigError naming the count to set, before any create or config change."""
    broker = make_broker()
    broker.add("a", 8, {"cleanup.policy": "delete"})
    specs = [TopicSpec("a", 6, 1, COMPACT), TopicSpec("b", 6)]
    message = await refused(ConfigError, ensure_topics(BOOT, specs))
    assert message == (
        "partition counts differ from the 6 asked (a has 8); nothing was changed: partitions cannot be removed:"
        " set topics.partitions = 8 in the topology (or pass --partitions 8)"
    )
    assert (broker.created, broker.config_reads, broker.altered) == ([], [], [])
    assert broker.clients[0].closed == 1


async def test_a_topic_with_fewer_partitions_than_asked_is_refused_before_anything_is_created(
    make_broker: MakeBroker,
) -> None:
    """Raising a count moves keys: ConfigError pointing to ``pipeline rescale`` with the count asked."""
    broker = make_broker()
    broker.add("a", 3, {"cleanup.policy": "delete"})
    specs = [TopicSpec("a", 6, 1, COMPACT), TopicSpec("b", 6)]
    message = await refused(ConfigError, ensure_topics(BOOT, specs))
    assert message == (
        "partition counts differ from the 6 asked (a has 3); nothing was changed:"
        f" raise them with 'pipeline rescale --partitions 6' {RESCALE_FIX}"
    )
    assert (broker.created, broker.config_reads, broker.altered) == ([], [], [])


async def test_counts_both_above_and_below_are_listed_in_spec_order_with_both_fixes(
    make_broker: MakeBroker,
) -> None:
    """Every wrong topic listed; the count to set is the largest found above; the count asked is the largest
    asked of a wrong topic; topics right or missing are not listed."""
    broker = make_broker()
    broker.add("b", 2)
    broker.add("a", 8)
    broker.add("c", 10)
    broker.add("d", 6)
    specs = [TopicSpec("b", 4), TopicSpec("a", 6), TopicSpec("c", 6), TopicSpec("d", 6), TopicSpec("e", 9)]
    message = await refused(ConfigError, ensure_topics(BOOT, specs))
    assert message == (
        "partition counts differ from the 6 asked (b has 2, a has 8, c has 10); nothing was changed:"
        " partitions cannot be removed: set topics.partitions = 10 in the topology (or pass --partitions 10);"
        f" or raise them with 'pipeline rescale --partitions 6' {RESCALE_FIX}"
    )
    assert broker.created == []


def test_no_partition_problem_when_every_existing_topic_has_the_count_asked() -> None:
    """Equal counts and missing topics are no problem."""
    specs = [TopicSpec("a", 6), TopicSpec("b", 6)]
    assert admin._partition_problem(specs, {"a": 6, "other": 1}) is None


async def test_a_topologys_topics_are_created_then_found_as_they_are_on_a_second_run(
    make_broker: MakeBroker,
) -> None:
    """Idempotent: the second run creates and alters nothing and finds every topic as "exists"."""
    broker = make_broker()
    specs = topic_specs(shop(effects=True))
    first = await ensure_topics(BOOT, specs)
    assert [(r.name, r.action, r.partitions) for r in first] == [
        (n, "created", 3) for n in SHOP_NAMES + EFFECT_NAMES
    ]
    second = await ensure_topics(BOOT, specs)
    assert second == [TopicResult(n, "exists", 3) for n in SHOP_NAMES + EFFECT_NAMES]
    assert len(broker.created) == 9
    assert broker.altered == []


# -- topic_layout ---------------------------------------------------------------------------------------


async def test_the_layout_has_each_topics_count_limit_and_ids_over_one_client(
    make_broker: MakeBroker,
) -> None:
    """Every topic the worker touches, in order: counts, limits (Kafka's default here), no timestamp bound,
    the cluster id and each topic's id; one describe, one config read, one Metadata request."""
    broker = make_broker(cluster_id="the-cluster")
    serve(broker, SHOP_NAMES)
    layout = await topic_layout(BOOT, shop())
    assert layout == TopicLayout(
        counts=dict.fromkeys(SHOP_NAMES, 3),
        limits=dict.fromkeys(SHOP_NAMES, 1_048_588),
        timestamps={},
        cluster="the-cluster",
        topic_ids={name: str(broker.topics[name].topic_id) for name in SHOP_NAMES},
    )
    assert broker.described == [SHOP_NAMES]
    assert broker.config_reads == [SHOP_NAMES]
    assert broker.metadata_asked == [SHOP_NAMES]
    assert broker.clients[0].kwargs["request_timeout_ms"] == 10_000
    assert broker.clients[0].closed == 1


async def test_the_layout_of_a_topology_with_effects_adds_its_effect_topics(make_broker: MakeBroker) -> None:
    """The effect topic and its changelog are counted and asked for too; the layout's timeout is the one given."""
    broker = make_broker()
    serve(broker, SHOP_NAMES + EFFECT_NAMES)
    for spec in topic_specs(shop(effects=True)):  # the changelogs as `pipeline topics create` makes them
        if "retention.ms" in spec.configs:
            broker.add(spec.name, 3, spec.configs)
    layout = await topic_layout(BOOT, shop(effects=True), timeout=2.5)
    assert layout.counts == dict.fromkeys(SHOP_NAMES + EFFECT_NAMES, 3)
    assert broker.metadata_asked == [SHOP_NAMES + EFFECT_NAMES]
    assert broker.clients[0].kwargs["request_timeout_ms"] == 2500


async def test_only_the_stages_changelogs_must_match_their_sources_count(make_broker: MakeBroker) -> None:
    """Audit, DLQ and command topics may have any count, each reported as it is."""
    broker = make_broker()
    serve(broker, SHOP_NAMES)
    broker.add("shop.audit", 1)
    broker.add("shop.orders", 12)
    layout = await topic_layout(BOOT, shop())
    assert layout.counts["shop.audit"] == 1
    assert layout.counts["shop.orders"] == 12
    assert layout.counts["shop.in"] == 3


@pytest.mark.parametrize("known", [False, True])
async def test_a_missing_topic_is_a_config_error_naming_the_first_one(
    make_broker: MakeBroker, known: bool
) -> None:
    """The first topic (in the worker's order) unknown, or known but not served: ConfigError saying to create
    the topics; configs and ids are not asked for."""
    broker = make_broker()
    serve(broker, [n for n in SHOP_NAMES if n not in {"shop.dlq", "shop.orders"}])
    if known:
        broker.add("shop.dlq", 3, hidden_for=1)
    message = await refused(ConfigError, topic_layout(BOOT, shop()))
    assert message == "topic shop.dlq does not exist: run 'pipeline topics create' first"
    assert broker.config_reads == []
    assert broker.metadata_asked == []


async def test_a_changelog_whose_count_differs_from_its_input_is_refused(make_broker: MakeBroker) -> None:
    """ConfigError naming the changelog, the input and both counts, and pointing to an unfinished rescale."""
    broker = make_broker()
    serve(broker, SHOP_NAMES)
    broker.add("shop-seen-changelog", 2)
    message = await refused(ConfigError, topic_layout(BOOT, shop()))
    assert message == (
        "changelog shop-seen-changelog has 2 partitions but shop.in has 3: they must match"
        " (a `pipeline rescale` that did not finish? run it again)"
    )


async def test_an_effect_changelog_whose_count_differs_from_the_effect_topic_is_refused(
    make_broker: MakeBroker,
) -> None:
    """The effect stage is checked as the first: its changelog against the effect topic."""
    broker = make_broker()
    serve(broker, SHOP_NAMES + EFFECT_NAMES)
    broker.add("shop-effects", 4)
    message = await refused(ConfigError, topic_layout(BOOT, shop(effects=True)))
    assert message.startswith("changelog shop-effects-changelog has 3 partitions but shop-effects has 4: ")


async def test_a_changelog_kept_shorter_than_its_claims_live_is_refused(make_broker: MakeBroker) -> None:
    """The broker's default 7 days on the changelogs of a 30-day effect TTL: ConfigError naming the first changelog,
    its retention and the one needed, and the command that sets it; the rules themselves: test_topic_checks.py."""
    broker = make_broker()
    serve(broker, SHOP_NAMES + EFFECT_NAMES)
    message = await refused(ConfigError, topic_layout(BOOT, shop(effects=True)))
    assert message.startswith(
        "changelog shop-seen-changelog has retention.ms=604800000 (7 days), shorter than the largest TTL plus a day"
        " (31 days): "
    )
    assert "run `pipeline topics create`" in message


async def test_effect_topics_are_not_needed_without_an_effect_route(make_broker: MakeBroker) -> None:
    """A topology without effects does not ask for, nor need, the effect topics."""
    broker = make_broker()
    serve(broker, SHOP_NAMES)
    broker.add("shop-effects", 4)  # left over, and wrong: not looked at
    layout = await topic_layout(BOOT, shop())
    assert set(layout.counts) == set(SHOP_NAMES)


async def test_each_topics_limit_is_its_own_up_to_the_pipelines_and_the_pipelines_when_unreadable(
    make_broker: MakeBroker,
) -> None:
    """A smaller max.message.bytes is kept; a larger one is capped at MAX_MESSAGE_BYTES; an absent, empty or
    non-numeric one is taken as MAX_MESSAGE_BYTES."""
    broker = make_broker(defaults={})
    serve(broker, SHOP_NAMES + EFFECT_NAMES)
    limits = {
        "shop.in": "1048588",
        "shop.audit": str(MAX_MESSAGE_BYTES + 1),
        "shop.dlq": MAX,
        "shop-seen-changelog": str(MAX_MESSAGE_BYTES - 1),
        "shop.commands": "abc",
        "shop.invoices": "",
        "shop.orders": "-5",
        "shop-effects": "0",
    }
    for name, value in limits.items():
        broker.topics[name].configs["max.message.bytes"] = value
    layout = await topic_layout(BOOT, shop(effects=True))
    assert layout.limits == {
        "shop.in": 1_048_588,
        "shop.audit": MAX_MESSAGE_BYTES,
        "shop.dlq": MAX_MESSAGE_BYTES,
        "shop-seen-changelog": MAX_MESSAGE_BYTES - 1,
        "shop.commands": MAX_MESSAGE_BYTES,
        "shop.invoices": MAX_MESSAGE_BYTES,
        "shop.orders": MAX_MESSAGE_BYTES,
        "shop-effects": 0,
        "shop-effects-changelog": MAX_MESSAGE_BYTES,  # absent
    }


@pytest.mark.parametrize(("topic", "policy"), [("shop.audit", "compact"), ("shop.dlq", "compact,delete")])
async def test_a_compacted_audit_or_dlq_topic_stops_the_worker_at_start_naming_it(
    make_broker: MakeBroker, topic: str, policy: str
) -> None:
    """The audit and DLQ records of a keyless input record have no key, which a compacted topic refuses: the
    layout refuses such a topic with one line naming it and the fix, before any record is handled."""
    broker = make_broker()
    serve(broker, SHOP_NAMES)
    broker.topics[topic].configs["cleanup.policy"] = policy
    with pytest.raises(ConfigError) as raised:
        await topic_layout(BOOT, shop())
    assert str(raised.value).startswith(f"topic {topic} has cleanup.policy={policy}: ")
    assert "pipeline topics create" in str(raised.value)


async def test_timestamp_bounds_are_reported_only_for_the_topics_that_bound_them(
    make_broker: MakeBroker,
) -> None:
    """Each topic's (before, after) from its own configs; topics taking any time are left out."""
    broker = make_broker()
    serve(broker, SHOP_NAMES)
    broker.topics["shop.in"].configs["message.timestamp.after.max.ms"] = "3600000"
    broker.topics["shop.dlq"].configs["message.timestamp.difference.max.ms"] = "60000"
    broker.topics["shop.audit"].configs |= {
        "message.timestamp.type": "LogAppendTime",
        "message.timestamp.after.max.ms": "1",
    }
    layout = await topic_layout(BOOT, shop())
    assert layout.timestamps == {"shop.in": (NO_LIMIT_MS, 3_600_000), "shop.dlq": (60_000, 60_000)}
