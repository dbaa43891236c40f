"""The worker's and the ingress's settings come from flags, then environment variables, then defaults."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import build_parser, ingress_settings, main, settings_defaults, shown, worker_settings
from pipeline.errors import ConfigError
from pipeline.ingress.server import IngressSettings
from pipeline.options import INGRESS_OPTIONS, WORKER_OPTIONS, Option
from pipeline.worker.settings import WORKER_DEFAULTS, WorkerSettings

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = {
    "worker": (WorkerSettings, WORKER_OPTIONS, worker_settings),
    "ingress": (IngressSettings, INGRESS_OPTIONS, ingress_settings),
}
CASES = [
    (command, field.name)
    for command, (settings_class, _, _) in COMMANDS.items()
    for field in dataclasses.fields(settings_class)
]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the environment that runs the tests."""
    for name in list(os.environ):
        if name.startswith("PIPELINE_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


def _option(command: str, field: str) -> Option:
    _, options, _ = COMMANDS[command]
    matching = [o for o in options if o.field == field]
    assert matching, f"{command}: the field {field} has no flag and no environment variable"
    return matching[0]


def _settings(command: str, *argv: str) -> Any:
    _, _, build = COMMANDS[command]
    return build(build_parser().parse_args([command, *argv]))


OTHER_TEXT = {"commit_policy": "interval", "event_loop": "asyncio"}  # fields whose text is one of a few words


def _other_value(command: str, field: str) -> tuple[list[str], str, Any]:
    """A valid non-default value: (flag arguments, variable text, expected field value)."""
    settings_class, options, _ = COMMANDS[command]
    option = _option(command, field)
    default = settings_defaults(settings_class, options)[field]
    hint = typing.get_type_hints(settings_class)[field]
    kind = next((m for m in typing.get_args(hint) if m is not type(None)), hint)
    if kind is bool:
        flag = option.flag if not default else "--no-" + option.flag.removeprefix("--")
        return [flag], str(not default).lower(), not default
    if kind in {int, float}:
        value = 9101 if default is None else default + 1
        return [option.flag, str(value)], str(value), option.to_field(value)
    text = OTHER_TEXT.get(field, f"other-{field}")
    return [option.flag, text], text, Path(text) if kind is Path else text


def _help(command: str) -> str:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(commands.choices[command].format_help().split())


@pytest.mark.parametrize(("command", "field"), CASES)
def test_every_field_is_set_by_its_flag(command: str, field: str) -> None:
    """Each settings field has a flag, and the flag's value reaches the settings (units converted)."""
    argv, _, expected = _other_value(command, field)
    assert getattr(_settings(command), field) != expected
    assert getattr(_settings(command, *argv), field) == expected


@pytest.mark.parametrize(("command", "field"), CASES)
def test_every_field_is_set_by_its_variable(
    command: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each settings field has an environment variable, read when the flag is absent."""
    _, text, expected = _other_value(command, field)
    monkeypatch.setenv(_option(command, field).env, text)
    assert getattr(_settings(command), field) == expected


@pytest.mark.parametrize(("command", "field"), CASES)
def test_the_flag_overrides_the_variable(command: str, field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given both, the flag wins over the environment variable."""
    argv, text, expected = _other_value(command, field)
    option = _option(command, field)
    default = _settings(command)
    monkeypatch.setenv(option.env, text)
    default_text = shown(option.to_flag(getattr(default, field)))
    if argv[0].startswith("--no-") or len(argv) == 1:  # a switch: turn it back to its default
        back = [f"--no-{option.flag[2:]}" if not getattr(default, field) else option.flag]
    else:
        back = [option.flag, "" if getattr(default, field) in (None, "") else default_text]
    assert getattr(_settings(command, *back), field) == getattr(default, field)
    assert getattr(_settings(command, *argv), field) == expected


def test_no_flags_and_no_variables_give_the_defaults() -> None:
    """Without flags or variables the worker gets WORKER_DEFAULTS and the documented paths."""
    settings = _settings("worker")
    assert settings == WorkerSettings(
        bootstrap="127.0.0.1:9092",
        topology=Path("topologies/default.toml"),
        state_dir=Path(".state/worker"),
        **WORKER_DEFAULTS,
    )
    assert settings.commit_interval == 1.0
    ingress = _settings("ingress")
    assert (ingress.host, ingress.port, ingress.trust_forwarded) == ("127.0.0.1", 8080, False)


def test_existing_flags_and_variables_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The names deployments already use set what they set before."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka:19092")
    monkeypatch.setenv("PIPELINE_TOPOLOGY", "/etc/t.toml")
    monkeypatch.setenv("PIPELINE_STATE_DIR", "/var/state")
    monkeypatch.setenv("PIPELINE_METRICS_PORT", "9100")
    monkeypatch.setenv("PIPELINE_INSTANCE_ID", "pipeline-worker-0")
    settings = _settings("worker", "--commit-interval-ms", "250", "--max-batch", "500")
    assert settings.bootstrap == "kafka:19092"
    assert settings.topology == Path("/etc/t.toml")
    assert settings.state_dir == Path("/var/state")
    assert settings.metrics_port == 9100
    assert settings.instance_id == "pipeline-worker-0"
    assert (settings.commit_interval, settings.max_batch) == (0.25, 500)
    monkeypatch.setenv("PIPELINE_INGRESS_HOST", "0.0.0.0")
    monkeypatch.setenv("PIPELINE_INGRESS_PORT", "8081")
    ingress = _settings("ingress", "--trust-forwarded")
    assert (ingress.host, ingress.port, ingress.trust_forwarded) == ("0.0.0.0", 8081, True)


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPELINE_MAX_BATCH= (empty, as templates leave it) gives the default, not an error."""
    monkeypatch.setenv("PIPELINE_MAX_BATCH", "")
    monkeypatch.setenv("PIPELINE_INSTANCE_ID", "")
    settings = _settings("worker")
    assert (settings.max_batch, settings.instance_id) == (10_000, None)


def test_metrics_port_none_turns_the_server_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optional number accepts 'none' from the flag or the variable."""
    monkeypatch.setenv("PIPELINE_METRICS_PORT", "9100")
    assert _settings("worker", "--metrics-port", "none").metrics_port is None
    monkeypatch.setenv("PIPELINE_METRICS_PORT", "none")
    assert _settings("worker").metrics_port is None


@pytest.mark.parametrize(
    ("command", "variable", "text", "problem"),
    [
        ("worker", "PIPELINE_MAX_BATCH", "abc", "'abc' is not an integer"),
        ("worker", "PIPELINE_COMMIT_INTERVAL_MS", "0.5", "'0.5' is not an integer"),
        ("worker", "PIPELINE_STORE_LOCK_WAIT", "soon", "'soon' is not a number"),
        ("worker", "PIPELINE_METRICS_PORT", "http", "'http' is not an integer"),
        ("ingress", "PIPELINE_INGRESS_PORT", "eighty", "'eighty' is not an integer"),
        ("ingress", "PIPELINE_INGRESS_TRUST_FORWARDED", "maybe", "'maybe' is not true or false"),
    ],
)
def test_an_unparsable_variable_is_one_line_and_exit_2(
    command: str,
    variable: str,
    text: str,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A variable that does not parse ends with exit 2 and one stderr line naming it, not a traceback."""
    monkeypatch.setenv(variable, text)
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args([command])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err == f"pipeline {command}: error: environment variable {variable}: {problem}\n"


def test_a_bad_variable_of_another_command_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPELINE_MAX_BATCH is read by the worker only, so the ingress starts with it set to junk."""
    monkeypatch.setenv("PIPELINE_MAX_BATCH", "abc")
    assert _settings("ingress").port == 8080


def test_an_unparsable_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag that does not parse exits 2 with argparse's error naming the flag."""
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["worker", "--max-batch", "abc"])
    assert raised.value.code == 2
    assert "argument --max-batch: 'abc' is not an integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "argv", "env", "message"),
    [
        ("worker", ["--max-batch", "0"], {}, "max batch must be at least 1"),
        ("worker", [], {"PIPELINE_SEND_BYTES": "10"}, "send bytes must be in"),
        ("worker", ["--commit-interval-ms", "61000"], {}, "commit interval must be in"),
        ("ingress", [], {"PIPELINE_INGRESS_RETRY_AFTER": "-1"}, "retry-after must be in"),
        ("ingress", ["--event-loop", "tokio"], {}, "event loop must be one of auto, uvloop, asyncio"),
    ],
)
def test_an_out_of_range_value_is_a_config_error(
    command: str, argv: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values that parse but are out of range are rejected when the settings are built."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        _settings(command, *argv)


def test_main_reports_an_out_of_range_value_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipeline worker` with an out-of-range setting exits 1 with one line, before loading anything."""
    monkeypatch.setenv("PIPELINE_LINGER_MS", "5000")
    assert main(["worker", "--topology", "no/such/topology.toml"]) == 1
    err = capsys.readouterr().err
    assert err == "pipeline: error: linger must be in [0, 1000] ms, got 5000\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_each_variable_and_default(command: str) -> None:
    """--help lists every flag with its variable and its default, the latter from the settings class."""
    settings_class, options, _ = COMMANDS[command]
    required = {f.name for f in dataclasses.fields(settings_class) if f.default is dataclasses.MISSING}
    text = _help(command)
    for option in options:
        field_default = option.default if option.field in required else _field_default(settings_class, option)
        assert option.flag in text
        assert f"env {option.env}; default {shown(option.to_flag(field_default))})" in text, option.field


def _field_default(settings_class: type, option: Option) -> Any:
    (field,) = [f for f in dataclasses.fields(settings_class) if f.name == option.field]
    return field.default


def test_help_shows_the_defaults_in_the_flags_units() -> None:
    """The worker's help shows 1000 ms for the 1 s commit interval, and the byte sizes in bytes."""
    text = _help("worker")
    assert "--commit-interval-ms MS" in text
    assert "env PIPELINE_COMMIT_INTERVAL_MS; default 1000)" in text
    assert "env PIPELINE_MAX_BATCH; default 10000)" in text
    assert "env PIPELINE_FETCH_MAX_BYTES; default 16777216)" in text
    assert "env PIPELINE_METRICS_PORT; default none)" in text


def test_operations_doc_lists_every_setting() -> None:
    """docs/operations.md's Settings section has one row per option with its flag, variable and default."""
    page = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"^## Settings\n(.*?)(?=^## |\Z)", page, re.DOTALL | re.MULTILINE)
    assert match, "docs/operations.md has no Settings section"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    for settings_class, options, _ in COMMANDS.values():
        defaults = settings_defaults(settings_class, options)
        for option in options:
            row = next((r for r in rows if f"`{option.flag}`" in r and f"`{option.env}`" in r), None)
            assert row, f"no row for {option.flag}"
            assert f"`{shown(defaults[option.field])}`" in row, option.flag
