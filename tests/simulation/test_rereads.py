"""The reread rule (tests/simulation/rereads.py): two commits refused for size with no reread of the limits between them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from pipeline.state.transaction import TransactionFailedError
from pipeline.worker.executor import TaskExecutor
from pipeline.worker.limits import TopicLimits
from tests.simulation.rereads import RereadCheck


def _world() -> Any:
    return SimpleNamespace(loop=SimpleNamespace(time=lambda: 1.5))


def test_two_size_refusals_without_a_reread_between_them_are_a_problem() -> None:
    """Refused for size, then refused again before any reread: one problem naming both times."""
    check = RereadCheck(_world())
    check.refused()
    check.refused()
    assert check.refusals == 2
    assert len(check.problems) == 1
    assert "refused for their size at 1.500 and again at 1.500" in check.problems[0]


def test_a_reread_between_two_size_refusals_is_no_problem() -> None:
    """Refused, the limits read again, refused again (a record too large alone, bisected): no problem."""
    check = RereadCheck(_world())
    check.refused()
    check.reread()
    check.refused()
    check.reread()
    assert check.problems == []


def _size_refusal() -> TransactionFailedError:
    exc = TransactionFailedError("transaction aborted: MessageSizeTooLargeError()")
    exc.__cause__ = MessageSizeTooLargeError()
    return exc


def test_installed_counts_only_size_refusals_and_puts_the_seams_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """While installed, a commit refused for size counts and another refusal does not; both seams are restored."""
    check = RereadCheck(_world())
    seen: list[object] = []

    def not_committed(_executor: object, exc: object, *_args: object) -> str:
        seen.append(exc)
        return "outcome"

    async def reread(_limits: object) -> None:
        seen.append("reread")

    monkeypatch.setattr(TaskExecutor, "_not_committed", not_committed)
    monkeypatch.setattr(TopicLimits, "reread", reread)
    executor: Any = TaskExecutor
    limits: Any = TopicLimits
    with check.installed():
        other = TransactionFailedError("transaction aborted: KafkaConnectionError()")
        other.__cause__ = KafkaConnectionError()
        assert executor._not_committed(None, other, {}, {}) == "outcome"
        assert check.refusals == 0
        executor._not_committed(None, _size_refusal(), {}, {})
        asyncio.run(limits.reread(None))
        executor._not_committed(None, _size_refusal(), {}, {})
    assert TaskExecutor.__dict__["_not_committed"] is not_committed
    assert TopicLimits.__dict__["reread"] is reread
    assert check.refusals == 2
    assert check.problems == []
    assert seen[2] == "reread"
