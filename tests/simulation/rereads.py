"""A commit refused for its size makes the worker read its topics' limits again, before the next one.

A topic's ``max.message.bytes`` can be lowered under running workers (the ``refuse-outputs size``
fault). A worker reads its topics' limits at start and checks each output against them before it
sends, so a lowered limit shows as a commit refused for a record too large; the worker then reads
the limits again (``TopicLimits.reread``), and the records too large for the new limit go to the
DLQ as ``too-large`` before they are sent. A worker that skips the reread learns nothing: every
such record costs one or two refused transactions and a new producer, which no other rule sees
unless there are enough of them to exhaust the step budget (defect 20: default seed 3276 alone).

:class:`RereadCheck` wraps the executor's handling of a commit that raised
(``TaskExecutor._not_committed``) and the reread while a run lasts: in one worker process, two
commits refused for their size with no reread between them are a problem. A reread that cannot
reach the broker counts (it keeps the limits read before, and the next refusal reads them again).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.state.transaction import TransactionFailedError
from pipeline.worker.executor import Outcome, TaskExecutor
from pipeline.worker.limits import TopicLimits
from pipeline.worker.poison import SIZE_ERRORS
from tests.simulation.loop import CURRENT

if TYPE_CHECKING:
    from tests.simulation.world import World

MAX_PROBLEMS = 5


class RereadCheck:
    """In each worker process, a reread of the topics' limits between any two commits refused for size."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.refusals = 0  # commits refused for their size (a count for the run's report)
        self.problems: list[str] = []
        self._unread: dict[str, float] = {}  # process -> when its last size refusal came, not yet reread

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``TaskExecutor._not_committed`` and ``TopicLimits.reread`` watched while the block runs."""
        not_committed, reread = TaskExecutor._not_committed, TopicLimits.reread
        check = self

        def watched(executor: TaskExecutor, exc: PipelineError, *args: Any, **kwargs: Any) -> Outcome:
            if isinstance(exc, TransactionFailedError) and isinstance(exc.__cause__ or exc, SIZE_ERRORS):
                check.refused()
            return not_committed(executor, exc, *args, **kwargs)

        async def rereading(limits: TopicLimits) -> None:
            check.reread()
            await reread(limits)

        TaskExecutor._not_committed = watched  # type: ignore[method-assign,assignment]
        TopicLimits.reread = rereading  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            TaskExecutor._not_committed = not_committed  # type: ignore[method-assign]
            TopicLimits.reread = reread  # type: ignore[method-assign]

    def refused(self) -> None:
        self.refusals += 1
        who = _who()
        now = self.world.loop.time()
        before = self._unread.get(who)
        self._unread[who] = now
        if before is not None and len(self.problems) < MAX_PROBLEMS:
            self.problems.append(
                f"{who}'s commits were refused for their size at {before:.3f} and again at {now:.3f}, and it did "
                "not read its topics' limits again in between: a lowered limit costs it a refused transaction "
                "per record"
            )

    def reread(self) -> None:
        self._unread.pop(_who(), None)


def _who() -> str:
    process = CURRENT.get()
    return process.name if process is not None else "?"
