"""The command line's logging (pipeline/cli/logs.py): the Kafka client's lines only when asked for."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pipeline.cli.logs import LIBRARY_LOG_ENV, configure, level_number


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Put the loggers configure() touches back as they were."""
    monkeypatch.delenv(LIBRARY_LOG_ENV, raising=False)
    loggers = [logging.getLogger(name) for name in ("aiokafka", "asyncio")]
    levels = [logger.level for logger in loggers]
    filters = [list(logger.filters) for logger in loggers]
    yield
    for logger, level, kept in zip(loggers, levels, filters, strict=True):
        logger.setLevel(level)
        logger.filters[:] = kept


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _topics_create(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pipeline", *flags, "topics", "create"]
    argv += ["--bootstrap", f"127.0.0.1:{_closed_port()}", "--timeout", "5"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "KAFKA_"))}
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=60, env={**environ, **(env or {})}
    )


def test_level_names_parse_and_off_is_above_every_level() -> None:
    """Level names in any case parse; ``off`` is above CRITICAL; anything else is a ValueError."""
    assert level_number("info") == logging.INFO
    assert level_number(" DEBUG ") == logging.DEBUG
    assert level_number("off") > logging.CRITICAL
    with pytest.raises(ValueError, match="'loud' is not one of"):
        level_number("loud")


@pytest.mark.usefixtures("restored")
def test_the_kafka_client_is_quiet_by_default_and_its_unclosed_reports_too() -> None:
    """With the library level off, aiokafka's ERROR lines and its unclosed-connection reports are dropped."""
    configure("INFO", "off")
    assert not logging.getLogger("aiokafka.client").isEnabledFor(logging.ERROR)
    asyncio_log = logging.getLogger("asyncio")
    unclosed = asyncio_log.makeRecord(
        "asyncio", logging.ERROR, __file__, 1, "Unclosed AIOKafkaConnection", (), None
    )
    ours = asyncio_log.makeRecord(
        "asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved", (), None
    )
    assert not asyncio_log.filter(unclosed)
    assert asyncio_log.filter(ours)
    assert os.environ[LIBRARY_LOG_ENV] == "off"  # what a supervisor's workers inherit


@pytest.mark.usefixtures("restored")
def test_a_library_level_asked_for_lets_its_lines_through() -> None:
    """``--library-log-level error`` shows aiokafka's ERROR lines and its unclosed reports again."""
    configure("INFO", "error")
    assert logging.getLogger("aiokafka.client").isEnabledFor(logging.ERROR)
    assert not logging.getLogger("aiokafka.client").isEnabledFor(logging.INFO)
    asyncio_log = logging.getLogger("asyncio")
    unclosed = asyncio_log.makeRecord(
        "asyncio", logging.ERROR, __file__, 1, "Unclosed AIOKafkaConnection", (), None
    )
    assert asyncio_log.filter(unclosed)


def test_a_broker_that_cannot_be_reached_is_one_line_without_the_clients_lines() -> None:
    """``topics create`` against a closed port prints only our one line; asked for, aiokafka's line is there too."""
    quiet = _topics_create()
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == [quiet.stderr.strip()], quiet.stderr
    assert quiet.stderr.startswith("pipeline: error: cannot reach Kafka at 127.0.0.1:")
    loud = _topics_create("--library-log-level", "error")
    assert "ERROR aiokafka Unable connect to" in loud.stderr
    from_env = _topics_create(env={LIBRARY_LOG_ENV: "error"})
    assert "ERROR aiokafka Unable connect to" in from_env.stderr


def test_a_log_level_that_is_not_one_is_a_usage_error() -> None:
    """A bad PIPELINE_LOG_LEVEL or --library-log-level is exit 2 naming the levels, not a traceback."""
    result = _topics_create(env={"PIPELINE_LOG_LEVEL": "chatty"})
    assert result.returncode == 2
    assert "log level 'chatty' is not one of" in result.stderr
    assert "Traceback" not in result.stderr
