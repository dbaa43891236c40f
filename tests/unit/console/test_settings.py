"""The console's settings: tokens parsed without ever showing them, and no start off loopback without tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.console.settings import ConsoleSettings, Role, is_loopback, parse_tokens
from pipeline.errors import ConfigError

TOPOLOGY = Path("topologies/default.toml")


def test_tokens_are_named_users_with_a_role() -> None:
    """``name:role:token`` entries, comma-separated, become users; a token may hold colons."""
    users = parse_tokens(" ann:read:aaaaaaaaaaaaaaaa , bob:redrive:bb:bb:bbbbbbbbbbbbb,")
    assert [(u.name, u.role) for u in users] == [("ann", Role.READ), ("bob", Role.REDRIVE)]
    assert users[1].token == "bb:bb:bbbbbbbbbbbbb"
    assert (users[0].can_redrive, users[1].can_redrive) == (False, True)
    assert "aaaa" not in repr(users)
    assert parse_tokens(None) == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("ann", "expected name:role:token"),
        ("ann:admin:aaaaaaaaaaaaaaaa", "role must be read or redrive"),
        ("ann:read:short-token", "at least 16 characters"),
        ("ann:read:aaaaaaaaaaaaaaaa,ann:redrive:bbbbbbbbbbbbbbbb", "share a name"),
        ("ann:read:aaaaaaaaaaaaaaaa,bob:redrive:aaaaaaaaaaaaaaaa", "share a token"),
    ],
)
def test_a_malformed_token_entry_is_refused_without_showing_the_token(text: str, match: str) -> None:
    """Each mistake is one ConfigError naming the entry, never its token."""
    with pytest.raises(ConfigError, match=match) as error:
        parse_tokens(text)
    assert "aaaaaaaaaaaaaaaa" not in str(error.value)
    assert "short-token" not in str(error.value)


LOOPBACK = [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True)]
ELSEWHERE = [("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("console.example", False)]


@pytest.mark.parametrize(("host", "loopback"), [*LOOPBACK, *ELSEWHERE])
def test_loopback_is_only_the_loopback_range(host: str, loopback: bool) -> None:
    """127.0.0.0/8, ::1 and localhost are loopback; any other address or name is not."""
    assert is_loopback(host) is loopback


def test_off_loopback_the_console_refuses_to_start_without_tokens() -> None:
    """0.0.0.0 without tokens is a ConfigError naming the variable; with a token, or on loopback, it starts."""
    with pytest.raises(ConfigError, match="PIPELINE_CONSOLE_TOKENS"):
        ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY, host="0.0.0.0")
    users = parse_tokens("ann:read:aaaaaaaaaaaaaaaa")
    assert not ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY, host="0.0.0.0", users=users).open_locally
    assert ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY).open_locally


@pytest.mark.parametrize(("field", "value"), [("port", 70000), ("refresh_seconds", 0.1), ("host", " ")])
def test_settings_out_of_range_are_refused(field: str, value: object) -> None:
    """A port, refresh or host out of range stops the console before it listens."""
    with pytest.raises(ConfigError):
        ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY, **{field: value})  # type: ignore[arg-type]
