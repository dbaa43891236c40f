"""What /healthz and /readyz say: each assigned partition's state, the problems, alive and ready."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition

from pipeline.worker.health import STOPPED, Health, partition_health
from pipeline.worker.lifecycle import PartitionState


class FakeTask:
    """An active task as health sees it: a lifecycle state, and whether it is stuck."""

    def __init__(self, state: PartitionState, *, stuck: bool = False) -> None:
        self.state = state
        self._stuck = stuck

    def stuck(self, now: float) -> bool:
        """Whether the partition has work waiting and no commit for too long."""
        return self._stuck


def _tasks(**states: FakeTask) -> dict[TopicPartition, Any]:
    """Tasks by partition of topic ``raw``, from ``p<number>=task``."""
    return {TopicPartition("raw", int(name[1:])): task for name, task in states.items()}


def test_every_partition_ready_is_ok_ready_and_alive() -> None:
    """All assigned partitions READY: ready, alive, status ok, each partition's state and no problems."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY), p1=FakeTask(PartitionState.READY))
    health = partition_health(tasks, tasks, failed=False)
    assert health == Health(True, {"status": "ok", "partitions": {"raw-0": "ready", "raw-1": "ready"}}, True)


def test_an_assigned_partition_not_held_here_is_unowned_and_not_ready() -> None:
    """A partition assigned but without a task is "unowned": the worker is alive but not ready, and says why."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY))
    assigned = [TopicPartition("raw", 0), TopicPartition("raw", 1)]
    health = partition_health(assigned, tasks, failed=False)
    assert health == Health(
        False,
        {
            "status": "not ready",
            "partitions": {"raw-0": "ready", "raw-1": "unowned"},
            "problems": ["raw-1 is unowned"],
        },
        True,
    )


def test_opening_and_restoring_are_alive_but_not_ready() -> None:
    """Partitions opening or restoring make the worker not ready (503 on /readyz) but alive (200 on /healthz)."""
    tasks = _tasks(p0=FakeTask(PartitionState.OPENING), p1=FakeTask(PartitionState.RESTORING))
    health = partition_health(tasks, tasks, failed=False)
    assert (health.ready, health.live) == (False, True)
    assert health.detail == {
        "status": "not ready",
        "partitions": {"raw-0": "opening", "raw-1": "restoring"},
        "problems": ["raw-0 is opening", "raw-1 is restoring"],
    }


def test_partitions_are_listed_by_topic_then_partition_number() -> None:
    """States and problems come in (topic, partition) order: raw-2 before raw-10, effects before raw."""
    tasks: dict[TopicPartition, Any] = {
        TopicPartition("raw", 10): FakeTask(PartitionState.BROKEN),
        TopicPartition("raw", 2): FakeTask(PartitionState.OPENING),
        TopicPartition("effects", 7): FakeTask(PartitionState.RESTORING),
    }
    health = partition_health(list(tasks), tasks, failed=False)
    assert list(health.detail["partitions"]) == ["effects-7", "raw-2", "raw-10"]
    assert health.detail["problems"] == ["effects-7 is restoring", "raw-2 is opening", "raw-10 is broken"]


def test_a_stuck_partition_makes_the_worker_unhealthy() -> None:
    """A READY partition with work waiting and no commit is "stuck": neither alive nor ready."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY, stuck=True), p1=FakeTask(PartitionState.READY))
    health = partition_health(tasks, tasks, failed=False)
    assert health == Health(
        False,
        {
            "status": "unhealthy",
            "partitions": {"raw-0": "stuck", "raw-1": "ready"},
            "problems": ["raw-0 is stuck"],
        },
        False,
    )


def test_a_stopping_worker_is_alive_but_not_ready() -> None:
    """A worker stopping (not failed) is taken out of service but not restarted."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY))
    health = partition_health(tasks, tasks, failed=False, stopping=True)
    assert health == Health(
        False,
        {"status": "not ready", "partitions": {"raw-0": "ready"}, "problems": ["the worker is stopping"]},
        True,
    )


def test_a_failed_worker_that_also_stops_gives_the_failure_alone() -> None:
    """Failed and stopping: one problem, the failure, and the worker is unhealthy."""
    health = partition_health([], {}, failed=True, stopping=True)
    assert health == Health(
        False,
        {"status": "unhealthy", "partitions": {}, "problems": ["the worker failed and is stopping"]},
        False,
    )


def test_a_standby_is_listed_without_touching_status() -> None:
    """Standbys appear under "standby" as plain dicts; the worker stays ok, ready and alive."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY))
    info = {"state": "opening", "position": -1, "lag_records": None, "lag_seconds": None}
    health = partition_health(tasks, tasks, failed=False, standbys={"raw-1": info})
    assert health == Health(
        True, {"status": "ok", "partitions": {"raw-0": "ready"}, "standby": {"raw-1": info}}, True
    )


def test_a_stopped_worker_is_neither_ready_nor_alive() -> None:
    """STOPPED, what a worker answers once its loop ended, says "stopped" and fails both probes."""
    assert Health(False, {"status": "stopped"}, False) == STOPPED


def test_warnings_are_shown_and_leave_a_ready_worker_ready() -> None:
    """A warning (a topic config the worker would refuse to start on, changed under it) is in the detail, and
    the worker stays ready and alive: it serves every partition."""
    tasks = _tasks(p0=FakeTask(PartitionState.READY))
    health = partition_health(tasks, tasks, failed=False, warnings=["changelog c has retention.ms=1"])
    assert health == Health(
        True,
        {"status": "ok", "partitions": {"raw-0": "ready"}, "warnings": ["changelog c has retention.ms=1"]},
        True,
    )
