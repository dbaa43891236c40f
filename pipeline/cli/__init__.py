"""The ``pipeline`` command line.

Every failure the user can cause or fix ends in one readable line on stderr
and a non-zero exit: 1 for a pipeline error, 2 for a usage error.
:mod:`~pipeline.cli.main` builds the parser, :mod:`~pipeline.cli.settings`
turns settings fields into flags and variables, :mod:`~pipeline.cli.services`
and :mod:`~pipeline.cli.tools` hold the commands.
"""

from __future__ import annotations

from pipeline.cli.main import build_parser, main
from pipeline.cli.services import GC_THRESHOLDS, tune_gc
from pipeline.cli.settings import (
    PROCESSES,
    ingress_settings,
    parse_processes,
    settings_defaults,
    shown,
    worker_settings,
)

__all__ = [
    "GC_THRESHOLDS",
    "PROCESSES",
    "build_parser",
    "ingress_settings",
    "main",
    "parse_processes",
    "settings_defaults",
    "shown",
    "tune_gc",
    "worker_settings",
]
