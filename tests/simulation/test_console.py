"""The console's redrives in the world (``tests/simulation/console.py``): they run, and the world reads their end.

Seeds run as the suite runs them, in a subprocess with a fixed hash seed (``tests.simulation.run``)."""

from __future__ import annotations

from tests.simulation.mixes import MIXES
from tests.simulation.test_simulation import _run


def _ends(stdout: str) -> list[str]:
    return [
        line.split(" ended: ", 1)[1]
        for line in stdout.splitlines()
        if " ended: " in line and " console" in line
    ]


def test_two_consoles_redrive_at_once_and_both_end_sent() -> None:
    """Redrive seed 11: two consoles redrive the 59 DLQ records of the plan at once, beside a replay; both runs end
    `sent` with every record sent, and the windows hold (each copy judged like any other)."""
    result = _run("--mix", "redrive", "--seed", "11", "--trace", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert _ends(result.stdout) == ["sent: {'sent': 59} ", "sent: {'sent': 59} "]


def test_a_console_whose_read_meets_an_outage_waits_for_the_broker_and_sends_every_record() -> None:
    """Redrive seed 4: the broker goes away for 28 s as a console begins to read the DLQ; its read waits (before,
    it took 5 s of silence for the end) and the run sends all 6 records."""
    result = _run("--mix", "redrive", "--seed", "4", "--trace", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "console-redrive #2 after 28 more steps" in result.stdout
    assert "sent: {'sent': 6} " in _ends(result.stdout)


def test_only_the_redrive_mix_has_console_redrives() -> None:
    """The other mixes draw none: their seeds replay as they were."""
    assert [name for name, mix in MIXES.items() if mix.console] == ["redrive"]
