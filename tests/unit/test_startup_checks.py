"""Misconfiguration is caught when the topology loads or a service starts: TTL bounds, secrets, topics flags."""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from pipeline import credentials, providers, topology
from pipeline.durations import parse_duration
from pipeline.errors import ConfigError, TopologyError
from pipeline.stack.up import dev_secrets

GOOD_SW = "whsec_" + base64.b64encode(random.Random(3).randbytes(24)).decode()


def _source(provider: str, **table: object) -> dict[str, object]:
    return {"provider": provider, "secrets": ["S1", "S2"], **table}


def _problems(**table: object) -> str:
    with pytest.raises(TopologyError) as caught:
        topology.parse({"sources": {"s": _source("stripe", **table)}}, origin="t.toml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        ("0.1ms", "sources.s.ttl: must be at least 1h, got '0.1ms'"),
        ("9999999999d", "sources.s.ttl: must be at most 365d, got '9999999999d'"),
        ("-1d", "sources.s.ttl: a duration must be positive, got '-1d'"),
        (-5, "sources.s.ttl: a duration must be positive, got -5"),
        (0, "sources.s.ttl: a duration must be positive, got 0"),
        ("seven days", "sources.s.ttl: expected a duration such as '7d'"),
        (float("inf"), "sources.s.ttl: must be at most 365d, got inf"),
        (float("nan"), "sources.s.ttl: expected a duration such as '7d'"),
        (True, "sources.s.ttl: expected a duration such as '7d'"),
    ],
)
def test_a_ttl_out_of_bounds_is_one_line_naming_the_bound(ttl: object, expected: str) -> None:
    """Too short, too long, negative, zero, non-numeric or non-finite TTLs are topology errors, not tracebacks."""
    message = _problems(ttl=ttl)
    assert expected in message
    assert "\n" not in message


def test_an_effect_ttl_has_the_same_bounds() -> None:
    """A route's effect_ttl below an hour is refused like a source's ttl."""
    data = {
        "sources": {"s": _source("stripe")},
        "routes": [{"source": "s", "command": "c", "effect_key": "data.id", "effect_ttl": "30s"}],
    }
    with pytest.raises(TopologyError, match=r"routes\[0\]\.effect_ttl: must be at least 1h"):
        topology.parse(data)


def test_huge_integers_are_bounded_not_overflowing() -> None:
    """An integer too large for a float is an error about the bound, never an OverflowError."""
    with pytest.raises(ValueError, match="must be at most"):
        parse_duration(10**400)


def test_a_source_without_ttl_takes_its_presets_default() -> None:
    """Paddle without ttl keeps keys for its replay window (91 days), not the generic 7 days."""
    topo = topology.parse({"sources": {"p": _source("paddle"), "s": _source("stripe")}})
    assert topo.sources["p"].ttl == providers.get("paddle").default_ttl == timedelta(days=91)
    assert topo.sources["s"].ttl == providers.get("stripe").default_ttl
    assert topo.changelog_retention == timedelta(days=92)


def test_bad_provider_options_are_topology_errors() -> None:
    """An option the preset does not take is reported at load, under the source's key."""
    message = _problems(options={"colour": "red"})
    assert "sources.s.options: provider 'stripe' has no option(s) colour" in message


def test_a_verified_generic_source_needs_a_signature_scheme() -> None:
    """A generic source with no signature_header would refuse every request: refused at load unless verify = 'none'."""
    data = {"sources": {"g": _source("generic", options={"key_header": "X-Id"})}}
    with pytest.raises(TopologyError, match=r"sources\.g\.verify: .* set options\.signature_header"):
        topology.parse(data)
    data["sources"]["g"]["verify"] = "none"
    assert topology.parse(data).sources["g"].verify is topology.Verify.NONE


@pytest.mark.parametrize(
    ("provider", "value", "reason"),
    [
        ("standard-webhooks", "whsec_abc-def_ghijk", "URL-safe base64"),
        ("standard-webhooks", "whsec_!!!!", "is not base64"),
        ("standard-webhooks", "whsec_", "empty after its 'whsec_' prefix"),
        ("standard-webhooks", "whsec_AAAAA", "whole number of bytes"),
        ("standard-webhooks", GOOD_SW + "\n", "whitespace"),
        ("sweego", "not base64!", "is not base64"),
        ("stripe", "sk_live_abc", "looks like a Stripe secret API key"),
        ("stripe", "whsec_abc\n", "whitespace"),
        ("paddle", "pdl_live_apikey_123", "looks like a Paddle API key"),
        ("github", " gh-key-1", "whitespace"),
        ("slack", "slack-key-1\n", "whitespace"),
    ],
)
def test_an_unusable_secret_fails_the_load_naming_the_variable(
    provider: str, value: str, reason: str
) -> None:
    """A set secret its provider cannot use is named by variable and source, never shown."""
    topo = topology.parse({"sources": {"s": _source(provider)}})
    env = {"S1": GOOD_SW if provider in {"standard-webhooks", "sweego"} else "fine", "S2": value}
    problems = credentials.secret_problems(topo, env)
    assert len(problems) == 1
    assert problems[0].startswith("S2 (secret of source 's'")
    assert reason in problems[0]
    if value != "whsec_":
        assert value.strip() not in problems[0]
    with pytest.raises(ConfigError, match="S2"):
        credentials.source_secrets(topo.sources["s"], env)


def test_load_with_the_environment_checks_secrets(tmp_path: Path) -> None:
    """credentials.load_checked(path, environ) refuses a bad secret with the file name; without environ it only parses."""
    path = tmp_path / "t.toml"
    path.write_text('[sources.svix]\nprovider = "standard-webhooks"\nsecrets = ["SVIX"]\n')
    with pytest.raises(TopologyError, match=r"t\.toml: SVIX \(secret of source 'svix'.*not standard base64"):
        credentials.load_checked(path, {"SVIX": "whsec_" + "ab_c" * 8})
    assert topology.load(path).sources["svix"].secret_env == ("SVIX",)
    assert credentials.load_checked(path, {"SVIX": GOOD_SW, "OTHER": "x"}).app == "webhooks"


def test_good_secrets_and_unset_or_empty_variables_pass() -> None:
    """Valid values pass; an unset or empty rotation variable is not an error at load."""
    topo = topology.parse({"sources": {"sw": _source("standard-webhooks"), "st": _source("stripe")}})
    env = {"S1": GOOD_SW, "S2": ""}
    assert credentials.secret_problems(topo, env) == []
    assert credentials.source_secrets(topo.sources["sw"], env) == [GOOD_SW]


def test_a_worker_verified_source_without_any_secret_is_refused() -> None:
    """require_secrets names the unset variables of a source the worker verifies, and ignores ingress ones."""
    topo = topology.parse(
        {
            "sources": {
                "w": _source("github", verify="worker"),
                "i": {"provider": "stripe", "secrets": ["I1"]},
            }
        }
    )
    with pytest.raises(
        ConfigError, match="source 'w' is verified in the worker but S1 or S2 is not set"
    ) as caught:
        credentials.require_secrets(topo, topology.Verify.WORKER, {"S1": ""})
    assert "'i'" not in str(caught.value)
    credentials.require_secrets(topo, topology.Verify.WORKER, {"S2": "x"})


def test_dev_secrets_always_decode() -> None:
    """The secrets `pipeline up` generates are valid for every provider, every time (they failed 6% before)."""
    topo = topology.load(Path(__file__).resolve().parents[2] / "topologies" / "default.toml")
    for _ in range(500):
        env: dict[str, str] = {}
        generated = dev_secrets(topo, env)
        assert generated
        assert credentials.secret_problems(topo, env) == []


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize("command", ["worker", "ingress", "topics create"])
def test_services_refuse_a_bad_secret_with_one_line(command: str, tmp_path: Path) -> None:
    """The worker, the ingress and topics create exit 1 with one line naming the variable, before any broker."""
    path = tmp_path / "t.toml"
    path.write_text('[sources.svix]\nprovider = "standard-webhooks"\nsecrets = ["SVIX_T"]\n')
    result = _cli(
        *command.split(), "--topology", str(path), "--bootstrap", "127.0.0.1:1", env={"SVIX_T": "whsec_a-b"}
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("pipeline: error: ")
    assert "SVIX_T (secret of source 'svix'" in result.stderr
    assert "whsec_a-b" not in result.stderr


def test_the_worker_refuses_a_source_it_verifies_without_a_secret(tmp_path: Path) -> None:
    """verify = 'worker' with the secret variable unset stops the worker at start, naming the variable."""
    path = tmp_path / "t.toml"
    path.write_text('[sources.gh]\nprovider = "github"\nsecrets = ["GH_T"]\nverify = "worker"\n')
    result = _cli("worker", "--topology", str(path), "--bootstrap", "127.0.0.1:1", env={"GH_T": ""})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "GH_T is not set" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bootstrap", "127.0.0.1:notaport"], "'127.0.0.1:notaport' is not host:port"),
        (["--partitions", "0"], "--partitions must be a positive integer"),
        (["--timeout", "-1"], "--timeout must be in (0, 3600] seconds"),
    ],
)
def test_topics_create_bad_flags_are_one_line(args: list[str], message: str) -> None:
    """Bad bootstrap, partition or timeout flags end in one line and exit 1, no traceback."""
    result = _cli("topics", "create", *args, env={})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("command", [["topics", "create"], ["worker"], ["ingress"], ["tail", "x"], ["up"]])
def test_a_bootstrap_without_a_port_is_refused(command: list[str], tmp_path: Path) -> None:
    """``--bootstrap HOST`` (or KAFKA_BOOTSTRAP_SERVERS=HOST) is one line asking for host:port, not a silent 9092."""
    for flags, env in (
        ([*command, "--bootstrap", "127.0.0.1"], {}),
        (command, {"KAFKA_BOOTSTRAP_SERVERS": "localhost"}),
    ):
        result = _cli(*flags, env=env)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert "has no port; give host:port (e.g. " in result.stderr


def test_the_worker_with_a_malformed_bootstrap_is_one_line(tmp_path: Path) -> None:
    """A bootstrap server with a non-numeric port is a one-line error, not a ValueError traceback."""
    result = _cli("worker", "--bootstrap", "127.0.0.1:notaport", "--state-dir", str(tmp_path), env={})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "is not host:port" in result.stderr
