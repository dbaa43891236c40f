"""WorkerSettings: its defaults, its bounds, and the table naming each field's flag and variable."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.ingress.server import IngressSettings
from pipeline.kafka.settings import DEFAULT_BOOTSTRAP
from pipeline.options import INGRESS_OPTIONS, WORKER_OPTIONS, Option
from pipeline.worker.settings import WORKER_DEFAULTS, WorkerSettings

REQUIRED: dict[str, Any] = {"bootstrap": "kafka:9092", "topology": Path("t.toml"), "state_dir": Path("state")}


def _settings(**changes: Any) -> WorkerSettings:
    return WorkerSettings(**(REQUIRED | changes))


def test_defaults_are_the_dataclass_defaults() -> None:
    """WORKER_DEFAULTS holds every field with a default, and a settings object built from nothing else has them."""
    settings = _settings()
    assert set(WORKER_DEFAULTS) == {f.name for f in dataclasses.fields(WorkerSettings)} - set(REQUIRED)
    assert {name: getattr(settings, name) for name in WORKER_DEFAULTS} == WORKER_DEFAULTS
    assert WORKER_DEFAULTS["commit_interval"] == 1.0
    assert WORKER_DEFAULTS["max_batch"] == 10_000
    assert WORKER_DEFAULTS["poll_records"] == 2000


def test_a_fetch_never_holds_more_than_a_transaction() -> None:
    """Records fetched at once are ``poll_records``, cut to ``max_batch`` when a transaction is smaller."""
    assert _settings().fetch_records == 2000
    assert _settings(max_batch=50).fetch_records == 50
    assert _settings(poll_records=500, max_batch=50_000).fetch_records == 500


def test_settings_are_immutable() -> None:
    """A settings object cannot be changed after it was validated."""
    settings = _settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_batch = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bootstrap": " "}, "bootstrap servers are empty"),
        ({"group": " g"}, "leading or trailing spaces"),
        ({"commit_interval": 0.0}, "commit interval"),
        ({"commit_interval": 61.0}, "commit interval"),
        ({"max_batch": 0}, "max batch"),
        ({"metrics_port": 65536}, "metrics port"),
        ({"session_timeout_ms": 999}, "session timeout"),
        ({"chunk_records": 0}, "chunk records"),
        ({"poll_records": 100_001}, "poll records"),
        ({"send_bytes": 1023}, "send bytes"),
        ({"linger_ms": 1001}, "linger"),
        ({"fetch_max_bytes": 1024}, "fetch max bytes"),
        ({"max_partition_fetch_bytes": 2 * 1024**3}, "max partition fetch bytes"),
        ({"restore_fetch_bytes": 0}, "restore fetch bytes"),
        ({"standby_replicas": -1}, "standby replicas"),
        ({"standby_replicas": 9}, "standby replicas"),
        ({"store_lock_wait": 0.0}, "store lock wait"),
        ({"open_timeout": -1.0}, "open timeout"),
        ({"stuck_after": 86_401.0}, "stuck after"),
        ({"restore_progress_every": float("nan")}, "restore progress every"),
    ],
)
def test_out_of_range_values_are_rejected(changes: dict[str, Any], message: str) -> None:
    """Each bound is checked at construction and the ConfigError names the setting."""
    with pytest.raises(ConfigError, match=message):
        _settings(**changes)


def test_every_problem_is_reported_at_once() -> None:
    """Several bad values give one ConfigError listing all of them."""
    with pytest.raises(ConfigError) as raised:
        _settings(max_batch=0, linger_ms=-1, stuck_after=0.0)
    assert {"max batch", "linger", "stuck after"} <= {
        p.split(" must")[0] for p in str(raised.value).split("; ")
    }


@pytest.mark.parametrize(
    ("options", "settings_class"), [(WORKER_OPTIONS, WorkerSettings), (INGRESS_OPTIONS, IngressSettings)]
)
def test_each_field_has_exactly_one_option(options: tuple[Option, ...], settings_class: type) -> None:
    """The option table names every field once, and no flag, destination or variable twice."""
    assert sorted(o.field for o in options) == sorted(f.name for f in dataclasses.fields(settings_class))
    for attribute in ("flag", "dest", "env"):
        names = [getattr(o, attribute) for o in options]
        assert len(names) == len(set(names)), attribute


@pytest.mark.parametrize(
    ("options", "settings_class"), [(WORKER_OPTIONS, WorkerSettings), (INGRESS_OPTIONS, IngressSettings)]
)
def test_only_required_fields_have_an_option_default(
    options: tuple[Option, ...], settings_class: type
) -> None:
    """A default lives in the dataclass, or in the option only when the dataclass has none."""
    required = {f.name for f in dataclasses.fields(settings_class) if f.default is dataclasses.MISSING}
    assert {o.field for o in options if o.default is not None} == required


def test_variable_names_follow_the_flags() -> None:
    """Worker variables are PIPELINE_<FLAG>, ingress ones PIPELINE_INGRESS_<FLAG>, except the shared two."""
    shared = {"bootstrap": "KAFKA_BOOTSTRAP_SERVERS", "topology": "PIPELINE_TOPOLOGY"}
    for prefix, options in (("PIPELINE_", WORKER_OPTIONS), ("PIPELINE_INGRESS_", INGRESS_OPTIONS)):
        for option in options:
            assert option.env == shared.get(option.field, prefix + option.dest.upper()), option.field


def test_existing_names_are_kept() -> None:
    """The flags and variables that deployments and docs already use still exist."""
    envs = {o.flag: o.env for o in (*WORKER_OPTIONS, *INGRESS_OPTIONS)}
    assert envs["--state-dir"] == "PIPELINE_STATE_DIR"
    assert envs["--group"] == "PIPELINE_GROUP"
    assert envs["--metrics-port"] == "PIPELINE_METRICS_PORT"
    assert envs["--session-timeout-ms"] == "PIPELINE_SESSION_TIMEOUT_MS"
    assert envs["--instance-id"] == "PIPELINE_INSTANCE_ID"
    assert envs["--host"] == "PIPELINE_INGRESS_HOST"
    assert envs["--port"] == "PIPELINE_INGRESS_PORT"
    assert {"--commit-interval-ms", "--max-batch", "--max-body-bytes", "--produce-timeout"} <= set(envs)


def test_millisecond_flags_convert_to_seconds() -> None:
    """--commit-interval-ms takes milliseconds for a field in seconds, both ways."""
    (option,) = [o for o in WORKER_OPTIONS if o.field == "commit_interval"]
    assert option.flag == "--commit-interval-ms"
    assert option.env == "PIPELINE_COMMIT_INTERVAL_MS"
    assert option.to_flag(WORKER_DEFAULTS["commit_interval"]) == 1000
    assert option.to_field(250) == 0.25
    assert option.to_field(None) is None


def test_bootstrap_default_is_shared() -> None:
    """The worker and the ingress use the same bootstrap option and default."""
    worker = {o.field: o for o in WORKER_OPTIONS}
    ingress = {o.field: o for o in INGRESS_OPTIONS}
    assert worker["bootstrap"] == ingress["bootstrap"]
    assert worker["bootstrap"].default == DEFAULT_BOOTSTRAP
    assert worker["topology"].to_flag(worker["topology"].default) == "topologies/default.toml"


def test_an_empty_group_defaults_to_the_topology_app_name() -> None:
    """No group given: the worker joins the group named after the topology's app, so topologies never share one."""
    settings = WorkerSettings(bootstrap="b", topology=Path("t.toml"), state_dir=Path("s"))
    assert settings.for_topology("shop").group == "shop"
    named = WorkerSettings(bootstrap="b", topology=Path("t.toml"), state_dir=Path("s"), group="g")
    assert named.for_topology("shop").group == "g"
