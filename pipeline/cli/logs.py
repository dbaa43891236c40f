"""The command line's logging: our lines at ``--log-level``, the libraries' only when asked for.

aiokafka logs every failed connection attempt, every metadata refresh of a
missing topic and every group event itself, at ERROR and INFO, around the one
line a command ends with. At the CLI those lines stay off unless
``--library-log-level`` (or ``PIPELINE_LIBRARY_LOG_LEVEL``) asks for them; the
pipeline's own lines are unchanged. An "Unclosed AIOKafkaConnection" report,
which aiokafka sends through asyncio's logger when a connection is collected
after an interrupted stop, counts as aiokafka's.
"""

from __future__ import annotations

import logging
import os
import sys

LIBRARY_LOG_ENV = "PIPELINE_LIBRARY_LOG_LEVEL"
LIBRARY_LOGGERS = ("aiokafka",)
QUIET = "off"
_OFF = logging.CRITICAL + 10  # above every level a library logs at
# what aiokafka sends through asyncio's exception handler (aiokafka/conn.py, __del__)
_LIBRARY_MESSAGES_ON_ASYNCIO = ("Unclosed AIOKafkaConnection",)


def level_number(text: str) -> int:
    """A level name (``debug``, ``INFO``, ...; ``off`` for none) as its number; ValueError otherwise."""
    word = text.strip().upper()
    if word == QUIET.upper():
        return _OFF
    number = logging.getLevelNamesMapping().get(word)
    if number is None:
        names = "debug, info, warning, error, critical or off"
        raise ValueError(f"log level {text.strip()[:40]!r} is not one of {names}")
    return number


class _LibraryLines(logging.Filter):
    """Drops asyncio's lines that are aiokafka's own reports, below the library level."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        return not str(record.msg).startswith(_LIBRARY_MESSAGES_ON_ASYNCIO)


def configure(level: str, library_level: str) -> None:
    """Send our lines to stderr at ``level`` and the libraries' at ``library_level`` (``off``: none).

    Raises ValueError for a level name that is not one. The library level is also
    exported as ``PIPELINE_LIBRARY_LOG_LEVEL``, so the worker processes a supervisor
    starts log the same way.
    """
    ours, theirs = level_number(level), level_number(library_level)
    logging.basicConfig(
        level=ours, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(theirs)
    asyncio_log = logging.getLogger("asyncio")
    for old in [f for f in asyncio_log.filters if isinstance(f, _LibraryLines)]:
        asyncio_log.removeFilter(old)
    asyncio_log.addFilter(_LibraryLines(theirs))
    os.environ[LIBRARY_LOG_ENV] = library_level.strip().lower()
