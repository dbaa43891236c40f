"""A record whose handling raises, through the whole worker: aborted, redone, dead-lettered alone.

The worker is built with a classifier that raises on one record (``Worker(classifier=...)``, the
seam the simulation uses for its faulty handlers); the other records of the batch are handled,
committed once, and the record that raised is in the DLQ as ``handler-error``, its key unclaimed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pipeline.contract import Delivery
from pipeline.worker.classify import Classified, Classifier
from pipeline.worker.loop import Worker

from .fakes import TOPICS, TOPOLOGY, FakeConsumer, FakeProducer, fake_io, keys_for, records, settings, tp

TP0 = tp(0)
KEYS = keys_for(0, 5)
BAD = KEYS[2]


class RaisingOn(Classifier):
    """The default classifier, except that one key's record raises (a bug in handling, not an invalid record)."""

    raised = 0

    def classify(self, delivery: Delivery) -> Classified:
        """Raise ``RuntimeError`` on :data:`BAD`; classify the others as usual."""
        if delivery.key == BAD.encode():
            RaisingOn.raised += 1
            raise RuntimeError("the handler blew up")
        return super().classify(delivery)


async def _run(tmp_path: Path, *, policy: str) -> FakeProducer:
    RaisingOn.raised = 0
    consumer = FakeConsumer(assign={TP0}, logs={TP0: records(0, 0, KEYS)})
    io, clients = fake_io(consumer=consumer)
    worker = Worker(
        settings(tmp_path, commit_policy=policy, commit_interval=0.05, open_timeout=5.0),
        TOPOLOGY,
        io=io,
        classifier=RaisingOn,
    )
    await worker.start()
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while clients.producers.latest().committed_offset() != len(KEYS):
        if loop.time() > deadline:
            worker.stop()
            await asyncio.gather(task, return_exceptions=True)
            raise AssertionError("the five records were never committed")
        await asyncio.sleep(0.005)
    worker.stop()
    await asyncio.wait_for(task, 5)
    return clients.producers.latest()


@pytest.mark.parametrize("policy", ["caught-up", "interval"])
async def test_a_record_whose_handling_raises_goes_to_the_dlq_alone_and_the_rest_is_committed(
    tmp_path: Path, policy: str
) -> None:
    """The batch that raised is aborted, never committed; the redo dead-letters that record alone
    (``handler-error``, with the exception) without handling it again, and commits the others' commands."""
    producer = await _run(tmp_path, policy=policy)
    assert RaisingOn.raised == 1  # handled once: on the redo it is poison, not handled again
    assert "abort" in producer.calls
    dlq = producer.dlq()
    assert [(d["offset"], d["reason"]) for d in dlq] == [(2, "handler-error")]
    assert "the handler blew up" in dlq[0]["error"]
    commands = {k.decode() for k in producer.committed_keys(TOPICS.commands) if k}
    assert commands == {k for k in KEYS if k != BAD}
