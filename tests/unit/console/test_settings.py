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


def test_the_start_line_says_where_it_listens_when_that_is_not_its_url() -> None:
    """On every address the line names the address beside the loopback URL; with --public-url the URL is it."""
    from pipeline import topology  # noqa: PLC0415
    from pipeline.console.server import Console  # noqa: PLC0415

    topo = topology.load(TOPOLOGY)
    users = parse_tokens("ann:read:aaaaaaaaaaaaaaaa")
    every = Console(ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY, host="0.0.0.0", users=users), topo)
    assert every.where == "http://127.0.0.1:8090/ (listening on 0.0.0.0:8090 (every address))"
    local = Console(ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY), topo)
    assert local.where == local.url == "http://127.0.0.1:8090/"
    public = ConsoleSettings(
        bootstrap="b:1", topology=TOPOLOGY, host="0.0.0.0", users=users, public_url="https://ops.example/"
    )
    assert Console(public, topo).where == "https://ops.example/ (listening on 0.0.0.0:8090 (every address))"
    assert public.allowed_hosts == {"localhost", "127.0.0.1", "::1", "ops.example"}


@pytest.mark.parametrize(
    "url", ["ops.example", "ftp://ops.example", "https://ops.example/console/", "https://"]
)
def test_a_public_url_is_a_scheme_and_a_host(url: str) -> None:
    """A public URL without http(s), without a host, or with a path (the pages link from /) is refused."""
    with pytest.raises(ConfigError, match="--public-url"):
        ConsoleSettings(bootstrap="b:1", topology=TOPOLOGY, public_url=url)
