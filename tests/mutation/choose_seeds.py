"""Choose the simulation seeds of a mutation run: ``python -m tests.mutation.choose_seeds``.

The seeds that found a defect or a hole (``tests/simulation/defects.py`` as recorded in
docs/reliability.md, and ``FOUND``) come first; then, from seeds ``--first``..``--last`` (0-99), the
seed that covers the most lines of ``pipeline/worker``, ``pipeline/state`` and
``pipeline/kafka`` not yet covered, again and again, until a seed adds no line or ``--count`` seeds are chosen
(a greedy set cover of line coverage). Prints the seeds, comma-separated, and what each one added.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path

#: the defects' seeds (docs/reliability.md, "The defects it shows") and the seeds in FOUND
REQUIRED = (0, 5, 6, 17, 22, 29, 187, 242, 331, 483, 1077, 1270, 1915, 2489, 3024, 5874, 10397)
BLOCK = 40
PACKAGES = ("pipeline/worker/", "pipeline/state/", "pipeline/kafka/")


def _lines(seed: int) -> tuple[int, frozenset[tuple[str, int]]]:
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import coverage  # noqa: PLC0415

    warnings.simplefilter("ignore")
    logging.getLogger().handlers.clear()
    sys.unraisablehook = lambda _unraisable: None
    from tests.simulation.world import run_seed  # noqa: PLC0415

    cov = coverage.Coverage(data_file=None, include=[f"*/{p}*" for p in PACKAGES])
    cov.start()
    try:
        run_seed(seed)
    finally:
        cov.stop()
    data = cov.get_data()
    root = f"{Path.cwd()}/"
    covered = {
        (path.removeprefix(root), line) for path in data.measured_files() for line in data.lines(path) or ()
    }
    return seed, frozenset(covered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.choose_seeds", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--last", type=int, default=99)
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(
            sys.executable,
            [sys.executable, "-m", "tests.mutation.choose_seeds", *sys.argv[1:]],
            dict(os.environ, PYTHONHASHSEED="0"),
        )
    seeds = sorted(set(REQUIRED) | set(range(args.first, args.last + 1)))
    context = multiprocessing.get_context("spawn")
    lines: dict[int, frozenset[tuple[str, int]]] = {}
    # a fresh pool every BLOCK seeds (what a seed leaves behind stays bounded); the executor's own
    # max_tasks_per_child deadlocks on Python 3.11 (CPython gh-115634, as tests/simulation/run.py says)
    for first in range(0, len(seeds), BLOCK):
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            lines.update(pool.map(_lines, seeds[first : first + BLOCK], chunksize=2))
        print(f"... {len(lines)}/{len(seeds)} seeds measured", file=sys.stderr, flush=True)
    union = frozenset().union(*lines.values())
    chosen = list(REQUIRED)
    have = frozenset().union(*(lines[s] for s in chosen))
    print(
        f"{len(union)} lines covered by seeds {args.first}-{args.last} and the required ones;"
        f" the {len(chosen)} required seeds cover {len(have)}"
    )
    while len(chosen) < args.count:
        best = max((s for s in seeds if s not in chosen), key=lambda s: (len(lines[s] - have), -s))
        gain = len(lines[best] - have)
        if gain == 0:  # every line any of them reaches is reached
            break
        chosen.append(best)
        have |= lines[best]
        print(f"seed {best}: +{gain} lines ({len(have)})")
    print(",".join(str(s) for s in chosen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
