"""The worker's log lines carry input (keys, errors quoting it) escaped, one line per event."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pipeline.contract import Delivery
from pipeline.worker.emitter import Emitter
from pipeline.worker.metrics import NullRecorder

from .fakes import TOPICS, outputs


class _Txn:
    """Takes the emitted records and keeps none: only the log line is looked at."""

    def emit(self, *_args: Any, **_kwargs: Any) -> None:
        """Drop the record."""


def test_a_key_holding_a_newline_stays_on_the_dlq_line(caplog: pytest.LogCaptureFixture) -> None:
    """A key ``k\\nINFO ...`` cannot forge a second log line: the newline is written as ``\\n``."""
    caplog.set_level(logging.WARNING, logger="pipeline.worker.emitter")
    forged = "stripe:evt_1\nINFO pipeline.console.redrive redrive 99 by mallory"
    delivery = Delivery(TOPICS.input, 0, 7, 1_700_000_000_000, forged.encode(), b"{}", [])
    emitter = Emitter(_Txn(), topics=TOPICS, outputs=outputs(), recorder=NullRecorder())  # type: ignore[arg-type]
    emitter.dlq(delivery, reason="bad-body", error=f"body of {forged} is not JSON", key=forged, source=None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line
    assert "key=stripe:evt_1\\nINFO pipeline.console.redrive" in line
