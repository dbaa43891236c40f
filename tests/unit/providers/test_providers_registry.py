"""The preset registry: names, lookup errors, options, and each preset's retry window and TTL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipeline import providers
from pipeline.errors import ConfigError, UnknownProviderError
from pipeline.providers.signing import sign

ALL_NAMES = [
    "generic",
    "github",
    "paddle",
    "shopify",
    "slack",
    "square",
    "standard-webhooks",
    "stripe",
    "sweego",
    "webhooker",
]


def _preset(name: str) -> providers.Provider:
    return providers.get(name, key_header="X-Id") if name == "generic" else providers.get(name)


def test_names_lists_every_preset_sorted() -> None:
    """names() is the sorted list of preset names."""
    assert providers.names() == ALL_NAMES


def test_unknown_provider_lists_the_known_names() -> None:
    """get() of an unknown name raises UnknownProviderError whose message lists the known names."""
    with pytest.raises(UnknownProviderError) as caught:
        providers.get("nope")
    for name in ALL_NAMES:
        assert name in str(caught.value)


def test_unknown_option_is_a_config_error() -> None:
    """An option a preset does not take is refused, listing what it does take."""
    with pytest.raises(ConfigError, match="no option"):
        providers.get("github", tolerance=10)
    with pytest.raises(ConfigError, match="it takes: tolerance"):
        providers.get("stripe", tolerence=10)


@pytest.mark.parametrize("value", [0, -5, "300", True])
def test_tolerance_must_be_positive_seconds(value: object) -> None:
    """tolerance takes a positive whole number of seconds."""
    with pytest.raises(ConfigError, match="tolerance"):
        providers.get("stripe", tolerance=value)


def test_tolerance_option_changes_the_window() -> None:
    """A preset built with tolerance=600 accepts 500 s of skew that the default rejects."""
    headers = sign("stripe", b"{}", "whsec_x", timestamp=1_700_000_000)
    providers.get("stripe", tolerance=600).verify(headers, b"{}", ["whsec_x"], now=1_700_000_500)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key_header": "X-Id", "encoding": "hex64"}, "encoding"),
        ({"key_fields": "status"}, "key_fields"),
        ({"key_fields": []}, "key_fields"),
        ({"key_header": ""}, "key_header"),
        ({"key_header": "X-Id", "retry_window": "soon"}, "retry_window"),
    ],
)
def test_generic_options_are_validated(options: dict[str, object], message: str) -> None:
    """Bad generic options are ConfigErrors naming the option."""
    with pytest.raises(ConfigError, match=message):
        providers.get("generic", **options)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_preset_is_a_provider(name: str) -> None:
    """Each preset satisfies the Provider protocol and carries its own name."""
    preset = _preset(name)
    assert isinstance(preset, providers.Provider)
    assert preset.name == name


@pytest.mark.parametrize("name", ALL_NAMES)
def test_default_ttl_outlives_the_retry_window_with_margin(name: str) -> None:
    """default_ttl >= retry_window + 1 day, and at least 7 days."""
    preset = _preset(name)
    assert preset.default_ttl >= preset.retry_window + timedelta(days=1)
    assert preset.default_ttl >= timedelta(days=7)


@pytest.mark.parametrize(
    ("name", "window", "ttl"),
    [
        ("stripe", timedelta(days=3), timedelta(days=7)),
        ("github", timedelta(days=3), timedelta(days=7)),
        ("shopify", timedelta(hours=48), timedelta(days=7)),
        ("standard-webhooks", timedelta(hours=28), timedelta(days=7)),
        ("slack", timedelta(hours=1), timedelta(days=7)),
        ("square", timedelta(hours=72), timedelta(days=7)),
        ("paddle", timedelta(days=3), timedelta(days=91)),
        ("webhooker", timedelta(days=3), timedelta(days=7)),
        ("sweego", timedelta(days=3), timedelta(days=7)),
        ("generic", timedelta(days=3), timedelta(days=7)),
    ],
)
def test_documented_retry_windows(name: str, window: timedelta, ttl: timedelta) -> None:
    """Each preset's retry window and default TTL (sources in pipeline/providers/presets.py)."""
    preset = _preset(name)
    assert (preset.retry_window, preset.default_ttl) == (window, ttl)


def test_generic_retry_window_option_drives_its_ttl() -> None:
    """generic's retry_window (a duration) sets the window; the TTL keeps its margin."""
    preset = providers.get("generic", key_header="X-Id", retry_window="10d")
    assert preset.retry_window == timedelta(days=10)
    assert preset.default_ttl == timedelta(days=15)
    assert providers.get(
        "generic", key_header="X-Id", retry_window=timedelta(hours=1)
    ).retry_window == timedelta(hours=1)
