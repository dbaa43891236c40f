"""The many-seed simulation run, started when the session begins and checked when it ends.

The 500 seeds ``scripts/test`` runs (each fault mix its share: ``--mix suite``,
``tests/simulation/mixes.py``) are CPU work: minutes on two cores. The broker tests
mostly wait (on the broker, on group joins, on the processes they start) and leave about
half of the CPU idle. So when the many-seed test is collected, its run starts at once as
a subprocess at the lowest CPU priority (``nice 19``: it takes only the CPU the other tests
leave, so their own pace barely changes), and the test is moved to the end of the
session, where it waits for the run and checks its verdict. A session that ends early
(``-x``, Ctrl-C) kills the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_NAME = "test_every_seed_holds_exactly_once_and_liveness"
DEFAULT_SEEDS = 500
JOBS = 2
NICE = 19


class BackgroundSeeds:
    """``python -m tests.simulation.run --seeds N`` in a subprocess, niced, its output in a temporary file."""

    def __init__(self, seeds: int, jobs: int = JOBS) -> None:
        self.seeds = seeds
        self.jobs = jobs
        self._output = tempfile.TemporaryFile(  # noqa: SIM115  # open for the run's life: stop() closes it
            mode="w+", encoding="utf-8", prefix="simulation-seeds-"
        )
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the run (returns at once)."""
        args = ["--mix", "suite", "--seeds", str(self.seeds), "--jobs", str(self.jobs), "--nice", str(NICE)]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.simulation.run", *args],
            cwd=ROOT,
            env=dict(os.environ, PYTHONHASHSEED="0"),
            stdout=self._output,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def result(self, timeout: float) -> tuple[int, str]:
        """Wait for the run (``timeout`` seconds at most: then it is killed); its exit code and output."""
        if self._process is None:
            self.start()
        process = self._process
        if process is None:  # start() sets it
            raise RuntimeError("the simulation run did not start")
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = -9
        self._output.seek(0)
        output = self._output.read()
        if code == -9:
            output += f"\n(killed: still running {timeout:.0f}s after the rest of the session ended)"
        return code, output

    def stop(self) -> None:
        """Kill the run if it still goes on; drop its output."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._output.close()


KEY = pytest.StashKey[BackgroundSeeds]()


def schedule(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the many-seed test to the end of ``items`` and start its run now (when it is selected)."""
    chosen = [item for item in items if getattr(item, "originalname", item.name) == TEST_NAME]
    if not chosen or config.getoption("--seed") is not None or config.getoption("collectonly"):
        return
    for item in chosen:
        items.remove(item)
        items.append(item)
    run = BackgroundSeeds(config.getoption("--seeds") or DEFAULT_SEEDS)
    run.start()
    config.stash[KEY] = run


def started(config: pytest.Config) -> BackgroundSeeds | None:
    """The run :func:`schedule` started for this session, if any."""
    return config.stash.get(KEY, None)


def stop(config: pytest.Config) -> None:
    """End this session's run, if any (at the session's end)."""
    run = config.stash.get(KEY, None)
    if run is not None:
        run.stop()
