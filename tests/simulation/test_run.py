"""The many-seed runner: a pool process that dies does not end the run, nor hide a seed; a seed leaves
nothing behind that runs during the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simulation.run import POOL_RETRIES, Run, run_many

MARKER = "PIPELINE_TEST_RUN_MARKER"


def _dies_at_seed_3_once(run: Run) -> tuple[Run, bool, str, float, int]:
    """Seed 3 kills its process the first time (as mutmut's timeout or the OOM killer would)."""
    marker = Path(os.environ[MARKER])
    if run[1] == 3 and not marker.exists():
        marker.touch()
        os._exit(1)
    return run, run[1] != 5, "problems:\n  seed 5 fails" if run[1] == 5 else "", 0.0, 0


def _always_dies_at_seed_3(run: Run) -> tuple[Run, bool, str, float, int]:
    """Seed 3 kills its process every time (a seed that crashes the interpreter)."""
    if run[1] == 3:
        os._exit(1)
    return run, True, "", 0.0, 0


def test_a_block_whose_process_died_is_run_again_and_every_seed_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seeds left by a dead pool process run in a fresh pool; a real failure among them still shows."""
    monkeypatch.setenv(MARKER, str(tmp_path / "died"))
    failures = run_many([("default", n) for n in range(8)], 2, one=_dies_at_seed_3_once)
    out = capsys.readouterr().out
    assert [seed for seed, _report in failures] == [("default", 5)]
    assert "a pool process died" in out
    assert "\n8 seeds in" in "\n" + out


def test_a_seed_that_always_kills_its_process_is_a_failure_after_the_retries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A block that dies more than ``POOL_RETRIES`` times fails its seeds left: the run does not pass."""
    failures = run_many([("default", n) for n in range(6)], 2, one=_always_dies_at_seed_3)
    out = capsys.readouterr().out
    assert ("default", 3) in [seed for seed, _report in failures]
    assert out.count("a pool process died") == POOL_RETRIES
    assert "its process died" in out


#: Seeds (under PYTHONHASHSEED=0, as every seed runs) whose killed workers' coroutines, kept until the run's end,
#: log when collected (default 8), and, in their ``finally`` blocks, report their exits to the fleet (retention 3).
LEAVE_KILLED_WORKERS = ("default:8", "retention:3")

#: Runs each seed in a directory of the test's, then collects with a handler on: the verdict, the problems then
#: and now, what was logged, whether the directory is still there.
_CHILD = """
import gc, json, logging, sys
from pathlib import Path
from tests.simulation import world
sys.unraisablehook = lambda _unraisable: None
lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
for n, spec in enumerate(sys.argv[2:]):
    mix, seed = spec.split(":")
    root = Path(sys.argv[1]) / str(n)
    world.tempfile.mkdtemp = lambda **_kw: (root.mkdir(), str(root))[1]
    result = world.run_seed(int(seed), mix)
    problems = list(result.problems)
    lines.clear()
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    gc.collect()
    logging.getLogger().removeHandler(handler)
    print(json.dumps({"ok": result.ok, "killed": any("SIGKILL" in t for t in result.trace), "lines": lines,
                      "problems": problems, "later": result.problems, "again": root.exists()}))
"""


def test_what_a_run_left_is_finalized_before_it_returns(tmp_path: Path) -> None:
    """A killed worker's coroutines are finalized before the run returns: collected later, they logged into
    the next seed's trace (at a moment that depends on the seeds before it) and added problems to a passed
    seed's result. The run's directory is gone."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), *LEAVE_KILLED_WORKERS],
        cwd=Path(__file__).resolve().parents[2],
        env=dict(os.environ, PYTHONHASHSEED="0"),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for spec, line in zip(LEAVE_KILLED_WORKERS, child.stdout.splitlines()[-2:], strict=True):
        seen = json.loads(line)
        assert seen["ok"], spec
        assert seen["killed"], spec
        assert seen["problems"] == seen["later"] == [], spec
        assert seen["lines"] == [], spec
        assert not seen["again"], spec
