"""WorkerSettings' bounds, edge by edge: each limit itself is accepted, the next value past it refused, by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.worker.settings import WorkerSettings

MIB = 1024 * 1024
KIB = 1024
REQUIRED: dict[str, Any] = {"bootstrap": "kafka:9092", "topology": Path("t.toml"), "state_dir": Path("state")}
BYTES = (
    "fetch_max_bytes",
    "max_partition_fetch_bytes",
    "restore_fetch_bytes",
    "restore_budget_bytes",
    "queue_bytes",
)
SECONDS = ("store_lock_wait", "open_timeout", "stuck_after", "restore_progress_every", "topic_check_interval")


def _settings(**changes: Any) -> WorkerSettings:
    return WorkerSettings(**(REQUIRED | changes))


ACCEPTED: list[dict[str, Any]] = [
    {"commit_interval": 0.001},
    {"commit_interval": 0.5},
    {"commit_interval": 60.0, "transaction_timeout": 120.0},
    {"commit_linger": 0.0},
    {"commit_linger": 0.5},
    {"commit_linger": 60.0},
    {"max_batch": 1},
    {"commit_policy": "interval"},
    {"commit_policy": "caught-up"},
    {"metrics_port": None},
    {"metrics_port": 0},
    {"metrics_port": 65535},
    {"group": "g"},
    {"session_timeout_ms": 1000},
    {"session_timeout_ms": 300_000},
    {"chunk_records": 1},
    {"chunk_records": 100_000},
    {"poll_records": 1},
    {"poll_records": 100_000},
    {"send_bytes": 1024},
    {"send_bytes": 64 * MIB},
    {"linger_ms": 0},
    {"linger_ms": 1000},
    {"standby_replicas": 0},
    {"standby_replicas": 8},
    {"max_clock_skew": 1.0},
    {"max_clock_skew": 30 * 86_400.0},
    {"transaction_timeout": 1.0, "commit_interval": 0.5},
    {"transaction_timeout": 900.0},
    *({name: 64 * KIB} for name in BYTES),
    *({name: 1024 * MIB} for name in BYTES),
    *({name: 0.001} for name in SECONDS),
    *({name: 86_400.0} for name in SECONDS),
]


@pytest.mark.parametrize("changes", ACCEPTED, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_each_limit_itself_is_accepted(changes: dict[str, Any]) -> None:
    """A value at a bound (or inside it) is a valid setting, kept as given."""
    settings = _settings(**changes)
    assert {name: getattr(settings, name) for name in changes} == changes


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"bootstrap": " "}, "bootstrap servers are empty"),
    ({"group": "g "}, "the consumer group 'g ' has leading or trailing spaces"),
    ({"commit_interval": 0.0}, "commit interval must be in (0, 60] seconds, got 0.0"),
    (
        {"commit_interval": 60.5, "transaction_timeout": 120.0},
        "commit interval must be in (0, 60] seconds, got 60.5",
    ),
    ({"commit_linger": -0.01}, "commit linger must be in [0, 60] seconds, got -0.01"),
    ({"commit_linger": 60.5}, "commit linger must be in [0, 60] seconds, got 60.5"),
    ({"max_batch": 0}, "max batch must be at least 1, got 0"),
    ({"commit_policy": "often"}, "commit policy must be one of caught-up, interval, got 'often'"),
    ({"metrics_port": -1}, "metrics port must be in [0, 65535], got -1"),
    ({"metrics_port": 65536}, "metrics port must be in [0, 65535], got 65536"),
    ({"http_host": " "}, "the HTTP listen host is empty"),
    ({"session_timeout_ms": 999}, "session timeout must be in [1000, 300000] ms, got 999"),
    ({"session_timeout_ms": 300_001}, "session timeout must be in [1000, 300000] ms, got 300001"),
    ({"chunk_records": 0}, "chunk records must be in [1, 100000], got 0"),
    ({"chunk_records": 100_001}, "chunk records must be in [1, 100000], got 100001"),
    ({"poll_records": 0}, "poll records must be in [1, 100000], got 0"),
    ({"poll_records": 100_001}, "poll records must be in [1, 100000], got 100001"),
    ({"send_bytes": 1023}, "send bytes must be in [1 KiB, 64 MiB], got 1023"),
    ({"send_bytes": 64 * MIB + 1}, f"send bytes must be in [1 KiB, 64 MiB], got {64 * MIB + 1}"),
    ({"linger_ms": -1}, "linger must be in [0, 1000] ms, got -1"),
    ({"linger_ms": 1001}, "linger must be in [0, 1000] ms, got 1001"),
    ({"standby_replicas": -1}, "standby replicas must be in [0, 8], got -1"),
    ({"standby_replicas": 9}, "standby replicas must be in [0, 8], got 9"),
    ({"max_clock_skew": 0.5}, "max clock skew must be in [1, 2592000] seconds, got 0.5"),
    ({"max_clock_skew": 2_592_001.0}, "max clock skew must be in [1, 2592000] seconds, got 2592001.0"),
    (
        {"transaction_timeout": 0.5, "commit_interval": 0.25},
        "transaction timeout must be in [1, 900] seconds, got 0.5",
    ),
    ({"transaction_timeout": 901.0}, "transaction timeout must be in [1, 900] seconds, got 901.0"),
    (
        {"transaction_timeout": 2.0, "commit_interval": 2.0},
        "transaction timeout (2s) must be longer than the commit interval (2s)",
    ),
    *(
        ({name: 64 * KIB - 1}, f"{name.replace('_', ' ')} must be in [64 KiB, 1 GiB], got {64 * KIB - 1}")
        for name in BYTES
    ),
    *(
        ({name: 1024 * MIB + 1}, f"{name.replace('_', ' ')} must be in [64 KiB, 1 GiB], got {1024 * MIB + 1}")
        for name in BYTES
    ),
    *(({name: 0.0}, f"{name.replace('_', ' ')} must be in (0, 86400] seconds, got 0.0") for name in SECONDS),
    *(
        ({name: 86_400.5}, f"{name.replace('_', ' ')} must be in (0, 86400] seconds, got 86400.5")
        for name in SECONDS
    ),
]


@pytest.mark.parametrize(
    ("changes", "message"),
    REFUSED,
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) if isinstance(c, dict) else "",
)
def test_the_next_value_past_each_limit_is_refused_with_its_reason(
    changes: dict[str, Any], message: str
) -> None:
    """Just past a bound the settings are refused, and the ConfigError says which setting, its range and the value."""
    with pytest.raises(ConfigError) as raised:
        _settings(**changes)
    assert str(raised.value) == message


def test_every_problem_is_listed_in_order_in_one_error() -> None:
    """Problems of the basic and the operational settings together: one ConfigError, each problem once, '; ' apart."""
    with pytest.raises(ConfigError) as raised:
        _settings(bootstrap="", http_host="", linger_ms=-1, stuck_after=0.0)
    assert str(raised.value) == (
        "bootstrap servers are empty; the HTTP listen host is empty; linger must be in [0, 1000] ms, got -1; "
        "stuck after must be in (0, 86400] seconds, got 0.0"
    )


def test_a_group_given_is_kept_for_every_topology_and_none_given_takes_the_apps_name() -> None:
    """for_topology leaves a named group as it is (the same settings) and fills an empty one with the app's name."""
    named = _settings(group="g", commit_interval=0.5)
    assert named.for_topology("shop") is named
    unnamed = _settings(commit_interval=0.5)
    shop = unnamed.for_topology("shop")
    assert shop.group == "shop"
    assert shop.commit_interval == 0.5
    assert unnamed.group == ""
