"""The demo counts only its own events, says MISMATCH when counts differ, and a failed demo fails ``up``."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import orjson
import pytest

from pipeline import topology
from pipeline.errors import PipelineError
from pipeline.ops.demo import Counts, plan, summary
from pipeline.stack.up import Up, UpSettings

ROOT = Path(__file__).resolve().parents[3]


def _topo() -> topology.Topology:
    return topology.load(ROOT / "topologies" / "default.toml")


def test_only_the_demos_own_keys_are_counted() -> None:
    """Audit and command records of other keys (an earlier run's, anyone's) leave the counts alone."""
    topo = _topo()
    stream = plan(topo, 12, seed=1)
    keys = stream.keys()
    mine = min(keys)
    counts = Counts()
    audit = topo.topics.audit
    for key, outcome in [(mine, "first"), (b"stripe:evt_previous_run", "first"), (mine, "duplicate")]:
        counts.count(audit, orjson.dumps({"key": key.decode(), "outcome": outcome}), audit, keys, key)
    counts.count(topo.topics.commands, orjson.dumps({"key": mine.decode()}), audit, keys, mine)
    counts.count(topo.topics.commands, orjson.dumps({"key": "stripe:evt_previous_run"}), audit, keys, None)
    assert (counts.first, counts.duplicate, counts.commands) == (1, 1, 1)


def test_a_plan_rerun_gets_fresh_event_ids() -> None:
    """Two demo runs never share an event key, so the second cannot be confused by the first."""
    topo = _topo()
    assert not plan(topo, 30).keys() & plan(topo, 30).keys()


def test_the_summary_marks_a_mismatch_and_returns_false() -> None:
    """One extra first decision is a MISMATCH line and a failed demo."""
    stream = plan(_topo(), 12, seed=2)
    counts = Counts(
        first=stream.unique + 1, duplicate=stream.retries, refused=stream.forged, commands=stream.unique
    )
    out = io.StringIO()
    assert summary(stream, counts, out) is False
    assert "[MISMATCH]" in out.getvalue()
    counts.first = stream.unique
    assert summary(stream, counts, io.StringIO()) is True


class _Failing:
    """A service whose run fails, as a demo that cannot send does."""

    async def start(self) -> None:
        """Nothing to start."""

    async def run(self) -> None:
        """Fail at once."""
        raise PipelineError("the demo could not post to http://127.0.0.1:1/webhooks/stripe")

    def stop(self) -> None:
        """Nothing to stop."""


def test_a_failing_task_makes_up_fail_with_its_message(tmp_path: Path) -> None:
    """up does not exit 0 when a task fails: the error reaches the command line as one line."""
    up = Up(UpSettings(topology=tmp_path / "t.toml", state_dir=tmp_path, bootstrap="127.0.0.1:1"))
    up._services = [_Failing()]  # what start() would make
    with pytest.raises(PipelineError, match="the demo could not post"):
        asyncio.run(up.run())
