"""The short chaos run (python -m tests.chaos.run --quick) as CI runs it: a private broker, faults, a checker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_chaos_run_passes() -> None:
    """SIGKILL, a SIGSTOP zombie and a broker restart under load: exactly once, and the run says PASS."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos.run", "--quick", "--seed", "20240501"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    # librdkafka's own lines ("%3|…|FAIL|rdkafka#…") would fill the tail during the broker restart
    tail = "\n".join([line for line in output.splitlines() if not line.startswith("%")][-80:])
    assert result.returncode == 0, f"chaos run exited {result.returncode}:\n{tail}"
    assert result.stdout.rstrip().splitlines()[-1] == "PASS", tail
