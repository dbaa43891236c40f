"""The console's settings: where it listens, whom it lets in, where the workers are.

Validated once, at start: a console listening anywhere but loopback refuses
to start without tokens. Tokens come from one environment variable,
``PIPELINE_CONSOLE_TOKENS``: comma-separated ``name:role:token`` entries,
role ``read`` or ``redrive`` (never a flag, which ``ps`` would show). Tokens
never appear in a repr, a log line or an error.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pipeline.console.guard import allowed_hosts, check_public_url
from pipeline.errors import ConfigError

TOKENS_ENV = "PIPELINE_CONSOLE_TOKENS"
MIN_TOKEN_CHARS = 16


class Role(StrEnum):
    """What a console user may do: read everything, or also redrive the DLQ."""

    READ = "read"
    REDRIVE = "redrive"


@dataclass(frozen=True)
class User:
    """One token's holder: the name logged with each redrive, the role, and the token (never shown)."""

    name: str
    role: Role
    token: str = field(repr=False)

    @property
    def can_redrive(self) -> bool:
        """Whether this user may redrive DLQ records."""
        return self.role is Role.REDRIVE


#: Who uses a console that listens on loopback without tokens: whoever can reach it on this machine.
LOCAL_USER = User("local", Role.REDRIVE, "")


def parse_tokens(text: str | None) -> tuple[User, ...]:
    """``name:role:token,...`` as users; a malformed entry is a ConfigError naming it by position, not by token."""
    users: list[User] = []
    for index, raw in enumerate((text or "").split(","), 1):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, rest = entry.partition(":")
        role, sep2, token = rest.partition(":")
        where = f"{TOKENS_ENV} entry {index}"
        if not (sep and sep2 and name.strip()):
            raise ConfigError(f"{where}: expected name:role:token")
        if role not in {r.value for r in Role}:
            raise ConfigError(f"{where} ({name.strip()}): role must be read or redrive, got {role[:20]!r}")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{where} ({name.strip()}): the token must have at least {MIN_TOKEN_CHARS} characters"
            )
        users.append(User(name.strip(), Role(role), token))
    if len({u.name for u in users}) != len(users):
        raise ConfigError(f"{TOKENS_ENV}: two entries share a name")
    if len({u.token for u in users}) != len(users):
        raise ConfigError(f"{TOKENS_ENV}: two entries share a token")
    return tuple(users)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ConsoleSettings:
    """Everything ``pipeline console`` needs; checked when made."""

    bootstrap: str
    topology: Path
    host: str = "127.0.0.1"
    port: int = 8090
    workers: tuple[str, ...] = ()
    group: str = ""  # empty: the topology's app name, as the worker's default
    users: tuple[User, ...] = field(default=(), repr=False)
    refresh_seconds: float = 3.0
    dlq_shown: int = 100  # DLQ records listed on a page (counts cover every record)
    public_url: str = ""  # where browsers reach it (behind a proxy, or by a name): its host is allowed

    def __post_init__(self) -> None:
        if not self.host.strip():
            raise ConfigError("--host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port}")
        if not 0.5 <= self.refresh_seconds <= 60:
            raise ConfigError(f"--refresh must be in 0.5..60 seconds, got {self.refresh_seconds:g}")
        if not 1 <= self.dlq_shown <= 10_000:
            raise ConfigError(f"the DLQ page size must be in 1..10000, got {self.dlq_shown}")
        if self.public_url:
            problem = check_public_url(self.public_url)
            if problem is not None:
                raise ConfigError(problem)
        if not self.users and not is_loopback(self.host):
            raise ConfigError(
                f"the console would listen on {self.host}, which is not loopback, without tokens: set "
                f"{TOKENS_ENV}=name:role:token[,...] (role read or redrive), or listen on 127.0.0.1"
            )

    @property
    def allowed_hosts(self) -> frozenset[str]:
        """The host names a request may name in its ``Host`` header (loopback, the listen address,
        ``public_url``'s host): any other is refused, so a rebound DNS name reaches nothing."""
        return allowed_hosts(self.host, self.public_url)

    @property
    def open_locally(self) -> bool:
        """No tokens, on loopback: every local visitor is the local user (with redrive)."""
        return not self.users
