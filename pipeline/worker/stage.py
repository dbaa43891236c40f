"""What a stage is to its partition: records in, output into the transaction, poison out.

A stage (:mod:`pipeline.worker.event_stage`, :mod:`pipeline.worker.effect_stage`)
handles a partition's records into its open transaction. When handling one
record raises, the stage raises :class:`HandlerFailedError` naming the record:
the partition aborts the transaction, and on the redo the stage is handed that
offset as *poison* and sends the record to the DLQ alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from pipeline.errors import PipelineError
from pipeline.state.partition_transaction import PartitionTransaction


class Poison(NamedTuple):
    """Why a record is sent to the DLQ without being handled again."""

    reason: str
    error: str
    restamp: bool = False  # its outputs (its DLQ record, when it is poison) are stamped with the current time


class HandlerFailedError(PipelineError):
    """Handling one record raised; the batch is aborted and redone with the record as poison."""

    retriable = True
    reason = "handler-error"

    def __init__(self, offset: int, error: str) -> None:
        self.offset = offset
        self.error = error
        super().__init__(f"offset {offset}: {error}")


class Stage(Protocol):
    """Handles one partition's records into its open transaction."""

    async def handle(self, records: Sequence[Any], poison: Mapping[int, Poison]) -> None: ...


async def handle_in_chunks(
    txn: PartitionTransaction,
    records: Sequence[Any],
    chunk: Callable[[Sequence[Any]], None],
    *,
    chunk_records: int,
) -> None:
    """Open the transaction, then ``chunk`` the records ``chunk_records`` at a time.

    The loop gets a turn between chunks, so the producer's sender and other
    partitions' commits (each a few broker round trips) move on while a large
    batch is handled; full batches leave at each turn.
    """
    await txn.begin()
    for start in range(0, len(records), chunk_records):
        if start:
            await asyncio.sleep(0)
        chunk(records[start : start + chunk_records])
        await txn.drain()
