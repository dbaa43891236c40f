"""The mutation script's ledger and selections (``scripts/mutation``, tests/mutation/run.py): no mutmut needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mutation.run import ROOT, Only, _functions, _judged, load_ledger, refresh_unmutated, save_ledger

POISON = "pipeline/worker/poison.py"
KILLED = "pipeline.worker.poison.xǁPoisonTrackerǁcommitted__mutmut_1"
SURVIVED = "pipeline.worker.poison.xǁPoisonTrackerǁcommitted__mutmut_2"
NOT_RUN = "pipeline.worker.poison.xǁPoisonTrackerǁhandler_failed__mutmut_1"


def _meta(work: Path, codes: dict[str, int | None], hashes: dict[str, str]) -> None:
    meta = work / "mutants" / f"{POISON}.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": codes,
                "hash_by_function_name": hashes,
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
        )
    )


def test_a_function_by_name_selects_its_lines_as_the_file_is_now() -> None:
    """``path:Class.method`` and ``path:function`` select the lines the function spans today."""
    spans = _functions(ROOT / POISON)
    only = Only.parse(f"{POISON}:PoisonTracker.committed")
    assert (only.first, only.last) == spans["xǁPoisonTrackerǁcommitted"]
    assert Only.parse("pipeline/state/decision.py:decide").first > 0
    assert Only.parse(f"{POISON}:12-20") == Only(POISON, 12, 20)


def test_an_unknown_function_is_one_readable_error() -> None:
    """A name the file does not define stops the script with a line saying so."""
    with pytest.raises(SystemExit, match=r"no function PoisonTracker\.nope in"):
        Only.parse(f"{POISON}:PoisonTracker.nope")


def test_the_ledger_keeps_judged_results_with_their_functions_hashes(tmp_path: Path) -> None:
    """Saved: only results judged so far, with the hash of each one's function; put back, they are judged."""
    run, ledger = tmp_path / "run", tmp_path / "ledger.json"
    _meta(
        run,
        {KILLED: 1, SURVIVED: 0, NOT_RUN: None},
        {"xǁPoisonTrackerǁcommitted": "aaa", "xǁPoisonTrackerǁhandler_failed": "bbb"},
    )
    assert save_ledger(ledger, run, [POISON], [Only(POISON)], "scripts/mutation ...") == 2
    saved = json.loads(ledger.read_text())["files"][POISON]
    assert saved == {
        "exit_code_by_key": {KILLED: 1, SURVIVED: 0},
        "hash_by_function_name": {"xǁPoisonTrackerǁcommitted": "aaa"},
    }
    fresh = tmp_path / "fresh"
    assert load_ledger(ledger, fresh) == 2
    assert _judged(fresh, [POISON]) == {KILLED, SURVIVED}


def test_no_ledger_yet_puts_nothing_back(tmp_path: Path) -> None:
    """The first run of a ledger starts from nothing."""
    assert load_ledger(tmp_path / "none.json", tmp_path / "run") == 0
    assert _judged(tmp_path / "run", [POISON]) == set()


def test_a_resumed_run_takes_the_unmutated_modules_as_they_are_now_and_keeps_the_mutated_ones(
    tmp_path: Path,
) -> None:
    """A module the run does not mutate, changed in the checkout since, is copied over the run's copy and mutmut's;
    the mutated module stays as the mutants were made from it, and a module unchanged is not touched."""
    root, work = tmp_path / "checkout", tmp_path / "work"
    for base, loop, tasks in ((root, "new loop", "new tasks"), (work, "old loop", "old tasks")):
        (base / "pipeline" / "worker").mkdir(parents=True)
        (base / "pipeline" / "worker" / "loop.py").write_text(loop)
        (base / "pipeline" / "worker" / "tasks.py").write_text(tasks)
        (base / "pipeline" / "errors.py").write_text("same")
    (work / "mutants" / "pipeline" / "worker").mkdir(parents=True)
    (work / "mutants" / "pipeline" / "worker" / "loop.py").write_text("old loop")
    copied = refresh_unmutated(work, ["pipeline/worker/tasks.py"], root=root)
    assert (work / "pipeline" / "worker" / "loop.py").read_text() == "new loop"
    assert (work / "mutants" / "pipeline" / "worker" / "loop.py").read_text() == "new loop"
    assert (work / "pipeline" / "worker" / "tasks.py").read_text() == "old tasks"
    assert sorted(copied) == [
        "mutants/pipeline/errors.py",
        "mutants/pipeline/worker/loop.py",
        "pipeline/worker/loop.py",
    ]
