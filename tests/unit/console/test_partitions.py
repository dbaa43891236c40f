"""A partition's row: its owner's state, and no false "unowned" before the workers were first asked."""

from __future__ import annotations

from pathlib import Path

from aiokafka import TopicPartition

from pipeline import topology
from pipeline.console.partitions import Partitions
from pipeline.console.workers import WorkerView

TOPO = topology.load(Path(__file__).resolve().parents[3] / "topologies" / "default.toml")


def test_a_partition_is_unowned_only_once_every_worker_has_answered() -> None:
    """Right after a start no worker has been asked: the row says so; once asked, a partition no worker
    owns is unowned, and an owned one takes its owner's state."""
    table = Partitions("b:1", TOPO, "")
    tp = TopicPartition(TOPO.topics.input, 1)
    fresh = [WorkerView("w:1")]
    assert table._row(tp, 5, 9, None, fresh).state == "not asked yet"
    asked = [WorkerView("w:1", sampled=True, reachable=True)]
    assert table._row(tp, 5, 9, None, asked).state == "unowned"
    owner = WorkerView(
        "w:1", sampled=True, reachable=True, owned={tp.topic: [1]}, states={f"{tp.topic}-1": "ready"}
    )
    row = table._row(tp, 5, 9, None, [owner])
    assert (row.state, row.owner, row.lag) == ("ready", "w:1", 4)
