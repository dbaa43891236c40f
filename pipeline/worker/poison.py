"""Which records of a partition go to the DLQ without being handled again, and how they are found.

Two ways a record becomes poison:

- handling it raised (:class:`~pipeline.worker.stage.HandlerFailedError` names it);
- the broker refuses the transaction's outputs with a non-retriable error, and
  the same failure repeats from the same offset: the transaction is *bisected*
  (each redo holds half as many records) until the record that fails is alone.
  Alone, it is judged only once the same failure repeats from it too: a one-off
  refusal (``CORRUPT_MESSAGE``, a bit flipped on the wire) never makes a record poison
  or stops the partition (poison seed 6 of the simulation).
  Refused for its timestamp, that record is first redone with its outputs stamped
  with the current time (``restamp``); refused again, or for any other reason, it
  goes to the DLQ (``unproducible``), with the broker's error. Its DLQ record
  refused for its timestamp is redone stamped with the current time too. When
  even its DLQ record is refused otherwise, or again, nothing more can be done
  for the partition: :meth:`PoisonTracker.commit_failed` says so, and the worker
  stops with one line naming the record.

Once a record is isolated, transactions grow back from one record, doubling on each
commit, to the size of the batch that failed (a slow start): when the records after it
are refused too, each costs two failed attempts, not a whole bisection from a full batch.

Retriable failures (broker down, timeouts) are simply redone: they never
bisect and never make poison.
"""

from __future__ import annotations

import logging

from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from pipeline.kafka.internals import InvalidRecordError
from pipeline.worker.stage import Poison

log = logging.getLogger(__name__)

UNPRODUCIBLE = "unproducible"
RESTAMP = "restamp"  # not poison: the record is handled again, its outputs stamped with the current time

# What the broker refuses because of what a record is, not because of how it is: redoing the
# same records fails the same way, so these (and only these) bisect a transaction.
RECORD_ERRORS = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    InvalidRecordError,  # INVALID_RECORD, taught to aiokafka: a keyless record on a compacted topic
)
# Said of a DLQ record refused for its timestamp after it was stamped with the worker's clock: the clock is off
CLOCK_HINT = (
    ", not even stamped with this host's clock (is the clock further from the broker's than the DLQ topic's"
    " message.timestamp.after.max.ms or before.max.ms allow?)"
)
# Of those, what a topic's limit refuses: a limit lowered since the worker read it
SIZE_ERRORS = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)


class PoisonTracker:
    """One partition's poison records and its bisection state."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.poison: dict[int, Poison] = {}
        self.limit: int | None = None  # bisecting: the most records one transaction may hold
        self._failed_at: tuple[int, str] | None = None  # (first offset, error) of the last failed commit
        self._until = 0  # the end of the batch being bisected
        self._span = 0  # how many records the batch that first failed held
        self._growing = False  # a record was isolated: the limit doubles on each commit, up to the span

    def handler_failed(self, offset: int, reason: str, error: str) -> bool:
        """Mark ``offset`` as poison; ``False`` when it already was (even its DLQ record failed)."""
        earlier = self.poison.get(offset)
        if earlier is not None and earlier.reason != RESTAMP:
            return False
        self.poison[offset] = Poison(reason, error)
        return True

    def commit_failed(self, start: int, count: int, cause: BaseException) -> str | None:
        """A non-retriable commit failure of ``count`` records from ``start``: redo, bisect, or isolate.

        Returns ``None``, or, when even the DLQ record of the isolated record was refused, one line
        saying so: the partition cannot go on.
        """
        what = type(cause).__name__
        again, self._failed_at = self._failed_at == (start, what), (start, what)
        if not again and (self.limit is None or count == 1):
            # once may be chance (a bit flipped on the wire): redo the same records before a batch is
            # bisected, and before one record alone is judged (restamped, dead-lettered, or the end);
            # halving a batch already bisected needs no second look
            return None
        if self.limit is None:
            self._until, self._span = start + count, count
        if count > 1:
            self.limit = max(1, count // 2)
            return None
        self.limit, self._failed_at, self._growing = 1, None, True  # this record alone, then a slow start
        earlier = self.poison.get(start)
        if earlier is not None and earlier.reason != RESTAMP:
            if not earlier.restamp and isinstance(cause, InvalidTimestampError):
                log.warning(
                    "%s: the DLQ record of offset %s is refused for its timestamp (%r); redoing it stamped with the current time",
                    self.name,
                    start,
                    cause,
                )
                self.poison[start] = earlier._replace(restamp=True)
                return None
            clock = CLOCK_HINT if earlier.restamp and isinstance(cause, InvalidTimestampError) else ""
            return f"offset {start} cannot be written even to the DLQ ({earlier.reason}){clock}: the broker refused it: {cause!r}"[
                :1000
            ]
        if earlier is None and isinstance(cause, InvalidTimestampError):
            log.warning(
                "%s: offset %s alone is refused for its timestamp (%r); redoing it stamped with the current time",
                self.name,
                start,
                cause,
            )
            self.poison[start] = Poison(RESTAMP, repr(cause)[:1000], restamp=True)
            return None
        log.warning("%s: offset %s alone fails to commit (%r); it goes to the DLQ", self.name, start, cause)
        self.poison[start] = Poison(UNPRODUCIBLE, f"the broker refused its outputs: {cause!r}"[:1000])
        return None

    def committed(self, end: int | None) -> None:
        """A commit up to ``end`` (exclusive) succeeded: forget what lies behind it."""
        self._failed_at = None
        if end is None:
            return
        if self.limit is not None:
            if self._growing:
                self.limit *= 2
                if self.limit >= self._span:
                    self.limit, self._growing = None, False  # grown back: full transactions
            elif end >= self._until:
                self.limit = None  # past the batch that failed, nothing isolated: full transactions
        for offset in [o for o in self.poison if o < end]:
            del self.poison[offset]
