"""Running the tasks into the worker's one transaction, committing it, and what each failure aborts.

:class:`TaskExecutor` has the serving tasks handle their queued records into the worker's
:class:`~pipeline.state.transaction.Transaction` (:meth:`~TaskExecutor.process`), says when
it is due (:meth:`~TaskExecutor.due`) and commits it (:meth:`~TaskExecutor.commit`). It
touches no consumer: what a failure needs done there comes back as an :class:`Outcome`,
which the task table applies.

What each failure aborts, now that a transaction spans partitions:

- handling a record raises: the whole transaction is aborted; every task in it goes back to
  its first record in it, and the record that raised goes to the DLQ alone on the redo (the
  other tasks redo their records once);
- a store fails while records are handled: the same, and that task is reopened;
- the broker refuses the transaction for what a record is (size, timestamp, a corrupt
  record): aborted and redone; when the transaction held several partitions, each of them
  (the *suspects*, in turn) then commits in a transaction of its own until it has committed
  alone once, so that the one whose record the broker refuses is found, and bisected as before
  (:mod:`pipeline.worker.poison`); the other partitions go on together in the transactions
  between two of those;
- any other refusal (broker down, timeouts): aborted and redone as it was;
- the group refuses the offsets (this worker's generation is over): aborted; the worker
  rejoins its group;
- the producer is fenced (the broker aborted a transaction that outlived its timeout, or
  another process took the transactional id), or cannot continue: aborted; a new producer,
  and after a fence the worker rejoins.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import (
    GroupGenerationFencedError,
    PartitionUnservedError,
    PipelineError,
    ProducerFencedError,
    ProducerUnusableError,
    StoreError,
)
from pipeline.state.transaction import CommitUncertainError, Transaction, TransactionFailedError
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.poison import RECORD_ERRORS, SIZE_ERRORS
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.stage import HandlerFailedError
from pipeline.worker.task import ActiveTask

log = logging.getLogger(__name__)

Tasks = Mapping[TopicPartition, ActiveTask]


@dataclass
class Outcome:
    """What the table and the worker must do after the executor ran."""

    rewind: dict[TopicPartition, int] = field(default_factory=dict)  # tasks to fetch again from an offset
    replace_producer: bool = False  # the producer is fenced or cannot continue
    rejoin: bool = False  # the group has moved on from this worker's generation (or its producer was fenced)
    fatal: PipelineError | None = None  # the worker cannot go on (a record not even the DLQ takes)
    reread_limits: bool = False  # a record was refused as too large: a topic's limit may have been lowered


class TaskExecutor:
    """The tasks' records into the worker's transaction, and its commit (see the module docstring)."""

    def __init__(self, txn: Transaction, settings: WorkerSettings, metrics: WorkerMetrics) -> None:
        self.txn = txn
        self.settings = settings
        self.metrics = metrics
        self.suspects: list[TopicPartition] = []  # after a refusal of several partitions: one a transaction
        self._alone_last = False  # the last transaction held a task that goes alone: the others go next

    def eligible(self, tasks: Tasks) -> list[ActiveTask]:
        """The tasks whose records may go into the transaction now.

        A task bisecting (a poison limit) or a suspect goes alone: into a transaction of its own,
        and only while it has records; the others go together, in the transactions between two of
        its (when they have records too), so that none waits more than one of its attempts.
        """
        serving = [tasks[tp] for tp in sorted(tasks, key=_order) if tasks[tp].serving]
        self.suspects = [tp for tp in self.suspects if tp in tasks and tasks[tp].serving]
        alone = set(self.suspects) | {t.tp for t in serving if t.poison.limit is not None}
        others = [t for t in serving if t.tp not in alone]
        if self.txn.open:
            holding = set(self.txn.parts)
            return [t for t in serving if t.tp in holding] if holding & alone else others
        bisecting = [t for t in serving if t.poison.limit is not None and t.queue]
        suspects = [tasks[tp] for tp in self.suspects if tasks[tp].queue]
        waiting = bisecting + suspects
        if waiting and (not self._alone_last or not any(t.queue for t in others)):
            return waiting[:1]
        return others

    async def process(self, tasks: Tasks) -> Outcome:
        """Handle the eligible tasks' queued records; abort everything on the first failure."""
        chosen = self.eligible(tasks)
        if not self.txn.open and chosen:
            self._alone_last = len(chosen) == 1 and (
                chosen[0].tp in self.suspects or chosen[0].poison.limit is not None
            )
        for task in chosen:
            try:
                await task.work()
            except HandlerFailedError as exc:
                outcome = await self._abort(task)
                if not task.poison.handler_failed(exc.offset, exc.reason, exc.error):  # not even to the DLQ
                    outcome.fatal = PartitionUnservedError(
                        f"partition {task.name}: offset {exc.offset} cannot even go to the DLQ: {exc.error}"
                    )
                log.warning(
                    "%s: offset %s failed (%s); the transaction is aborted, the record goes to the DLQ alone",
                    task.name,
                    exc.offset,
                    exc.error,
                )
                return outcome
            except StoreError as exc:
                outcome = await self._abort(task)
                task.broken(exc)
                return outcome
            except (KafkaError, TransactionFailedError) as exc:
                log.warning("%s: handling failed (%r); aborting and redoing", task.name, exc)
                return await self._abort(task)
            except ProducerFencedError as exc:
                log.warning("%s", exc)
                outcome = await self._abort(task)
                outcome.replace_producer = outcome.rejoin = True
                return outcome
            except ProducerUnusableError as exc:
                log.warning("%s", exc)
                outcome = await self._abort(task)
                outcome.replace_producer = True
                return outcome
        return Outcome()

    def due(self, tasks: Tasks) -> bool:
        """Whether the open transaction should commit now: a bisecting task at its limit; every task in it
        caught up (policy ``caught-up``) and the transaction ``commit_linger`` old; or it is old or big
        enough."""
        due_in = self.due_in(tasks)
        return due_in is not None and due_in <= 0

    def due_in(self, tasks: Tasks) -> float | None:
        """Seconds until the open transaction is due (0 or less: now; None: none is open). A caught-up
        transaction lingers ``commit_linger`` for more records: at a steady low rate a commit then holds
        the records of that long, not one cycle's, which is most of a commit's cost at 1,000 events/s."""
        txn = self.txn
        if not txn.open:
            return None
        members = [tasks[tp] for tp in txn.parts if tp in tasks]
        settings = self.settings
        if any(task.at_limit for task in members) or txn.records >= settings.max_batch:
            return 0.0
        age = time.monotonic() - txn.opened_at
        if self._caught_up(members):
            return min(settings.commit_linger, settings.commit_interval) - age
        return settings.commit_interval - age

    def lingering(self, tasks: Tasks) -> bool:
        """Whether the open transaction waits out its linger: every task in it caught up (policy
        ``caught-up``), not yet due. Records that come meanwhile wait for its end (one fetch takes them all)."""
        due_in = self.due_in(tasks)
        if due_in is None or due_in <= 0:
            return False
        return self._caught_up([tasks[tp] for tp in self.txn.parts if tp in tasks])

    def _caught_up(self, members: list[ActiveTask]) -> bool:
        return self.settings.commit_policy == "caught-up" and all(
            t.caught_up and not t.queue for t in members
        )

    async def commit(self, tasks: Tasks) -> Outcome:
        """Commit the open transaction; on a failure, the tasks in it go back to their first record (or
        reopen, when it may have committed: :meth:`_not_committed`)."""
        txn = self.txn
        outcome = Outcome()
        if not txn.open:
            return outcome
        held = {tp: (p.first_offset, p.records, p.next_offset) for tp, p in txn.parts.items()}
        began = time.perf_counter()
        try:
            committed = await txn.commit()
        except (
            TransactionFailedError,
            CommitUncertainError,
            GroupGenerationFencedError,
            ProducerFencedError,
            ProducerUnusableError,
        ) as exc:
            return self._not_committed(exc, held, tasks)
        self.metrics.commit_seconds.observe(time.perf_counter() - began)
        for tp, result in committed.parts.items():
            task = tasks.get(tp)
            if task is not None:
                task.committed(result, held[tp][2])
        self.suspects = [tp for tp in self.suspects if tp not in committed.parts]
        return outcome

    def _not_committed(
        self,
        exc: PipelineError,
        held: dict[TopicPartition, tuple[int | None, int, int | None]],
        tasks: Tasks,
    ) -> Outcome:
        """What a commit that raised asks: its tasks back at their first record in it (it was aborted), or,
        when it may have committed, reopened; a new producer, a rejoin, or a stop, as the error says."""
        starts = {tp: first for tp, (first, _, _) in held.items() if first is not None}
        outcome = Outcome()
        if isinstance(exc, CommitUncertainError):
            # its records must not be redone from here: each task reopens at the group's committed
            # offset, its store restored from its changelog (both hold the commit if it took)
            log.warning("%s; reopening %s from the group's committed offsets", exc, _names(held))
            for tp in held:
                task = tasks.get(tp)
                if task is not None:
                    task.broken(exc)
            outcome.replace_producer, outcome.rejoin = True, exc.fenced
            return outcome
        outcome.rewind = starts
        if isinstance(exc, TransactionFailedError):
            outcome.fatal = self._refused(exc, held, tasks)
            outcome.reread_limits = isinstance(exc.__cause__ or exc, SIZE_ERRORS)
            outcome.replace_producer = self.txn.producer.needs_replacing
        elif isinstance(exc, GroupGenerationFencedError):
            log.warning("%s; aborted, rejoining the group", exc)
            outcome.rejoin = True
        elif isinstance(exc, ProducerFencedError):
            log.warning("%s; aborted, starting a new producer and rejoining the group", exc)
            outcome.replace_producer, outcome.rejoin = True, True
        else:
            log.warning("%s; aborted, starting a new producer", exc)
            outcome.replace_producer = True
        return outcome

    def _refused(
        self,
        exc: TransactionFailedError,
        held: dict[TopicPartition, tuple[int | None, int, int | None]],
        tasks: Tasks,
    ) -> PipelineError | None:
        """After a refused commit: isolate the partitions of a refusal a record caused, bisect a lone one."""
        cause = exc.__cause__ or exc
        log.warning(
            "transaction of %s refused: %s; redoing from %s",
            _names(held),
            exc,
            ", ".join(
                f"{tp.topic}-{tp.partition}@{first}" for tp, (first, _, _) in sorted(held.items(), key=_item)
            ),
        )
        if not isinstance(cause, RECORD_ERRORS):
            return None
        for tp in held:
            task = tasks.get(tp)
            if task is not None:
                task.tally.clear()
        if len(held) > 1:
            # suspects this transaction did not hold stay ones: else two sets could take turns, forever
            self.suspects = sorted({*self.suspects, *held}, key=_order)
            log.warning("transactions hold one partition each until %s commit alone", _names(held))
            return None
        ((tp, (first, count, _)),) = held.items()
        task = tasks.get(tp)
        if task is None or first is None:
            return None
        verdict = task.poison.commit_failed(first, count, cause)
        return None if verdict is None else PartitionUnservedError(f"partition {task.name}: {verdict}")

    async def _abort(self, failed: ActiveTask) -> Outcome:
        """Abort the transaction: every task in it, and ``failed``, goes back to its first record in it."""
        outcome = Outcome()
        starts = {tp: p.first_offset for tp, p in self.txn.parts.items() if p.first_offset is not None}
        part = failed.part
        if part is not None and part.first_offset is not None:
            starts.setdefault(failed.tp, part.first_offset)
            part.reset()
        try:
            await self.txn.abort()
        except ProducerFencedError as exc:
            log.warning("%s", exc)
            outcome.replace_producer = outcome.rejoin = True
        except ProducerUnusableError as exc:
            log.warning("%s", exc)
            outcome.replace_producer = True
        outcome.rewind = starts
        return outcome

    async def abort(self) -> Outcome:
        """Abort the open transaction (the worker stops after a failure): its tasks go back."""
        outcome = Outcome()
        outcome.rewind = {
            tp: p.first_offset for tp, p in self.txn.parts.items() if p.first_offset is not None
        }
        try:
            await self.txn.abort()
        except (ProducerFencedError, ProducerUnusableError, KafkaError) as exc:
            log.info("nothing more to abort (%s)", exc)
        return outcome


def _order(tp: TopicPartition) -> tuple[str, int]:
    return (tp.topic, tp.partition)


def _item(item: tuple[TopicPartition, object]) -> tuple[str, int]:
    return _order(item[0])


def _names(held: Mapping[TopicPartition, object]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(held, key=_order))
