"""Run simulation seeds: ``python -m tests.simulation.run [--mix NAME] --seeds 1000 [--jobs 2] [--first 0]``.

One seed (``--seed N``) prints its scenario and verdict, and its trace with ``--trace``.
Many seeds print a line per failure and, at the end, how many failed and the seeds
per second. ``--mix`` picks the fault mix (``tests/simulation/mixes.py``: default, poison,
standby, time, redrive, rescale, static, retention, classic); ``--mix suite`` runs each mix's share of the seeds, as
``scripts/test`` does. Runs are reproducible only under one hash seed: the runner starts its
workers with ``PYTHONHASHSEED=0`` (and re-executes itself with it when it is unset).
Exit status: 0 when every seed passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable

HASH_SEED = "0"
SEEDS_PER_PROCESS = 50
POOL_RETRIES = 2  # a block whose pool process dies is run again this many times


def _ensure_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        os.execve(sys.executable, [sys.executable, "-m", "tests.simulation.run", *sys.argv[1:]], env)


def _quiet() -> None:
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    warnings.simplefilter("ignore")
    logging.getLogger().handlers.clear()
    # the tasks of a killed process never finish; their coroutines are closed when the run is
    # dropped, which Python reports as unraisable: nothing to see
    sys.unraisablehook = lambda _unraisable: None


def _init() -> None:
    _quiet()


Run = tuple[str, int]  # (mix, seed)


def _one(run: Run) -> tuple[Run, bool, str, float, int]:
    from tests.simulation.world import run_seed  # noqa: PLC0415

    mix, seed = run
    result = run_seed(seed, mix)
    return (
        run,
        result.ok,
        result.report(trace_lines=80) if not result.ok else "",
        result.virtual_s,
        result.steps,
    )


def _first_problem(report: str) -> str:
    lines = report.splitlines()
    return lines[lines.index("problems:") + 1].strip()[:300] if "problems:" in lines else ""


def run_many(
    seeds: Iterable[Run],
    jobs: int,
    *,
    stop_after: int | None = None,
    one: Callable[[Run], tuple[Run, bool, str, float, int]] = _one,
) -> list[tuple[Run, str]]:
    """Run ``seeds`` (mix, seed) on ``jobs`` processes; return ((mix, seed), report) of each failure.

    ``one`` runs a seed (a module-level function: the pool's processes import it).
    """
    failures: list[tuple[Run, str]] = []
    seeds = list(seeds)
    started = time.monotonic()
    done = 0
    if jobs == 1:  # in this process (a replay under a debugger, a scratch copy of the package)
        _init()
        for seed in seeds:
            _seed, ok, report, _virtual, _steps = one(seed)
            done += 1
            if not ok:
                failures.append((seed, report))
                print(f"FAIL {seed[0]}:{seed[1]}: {_first_problem(report)}", flush=True)
                if stop_after is not None and len(failures) >= stop_after:
                    break
        elapsed = time.monotonic() - started
        print(
            f"{done} seeds in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.2f} seeds/s on 1 process): {len(failures)} failed"
        )
        return failures
    context = multiprocessing.get_context("spawn")
    # Fresh processes every SEEDS_PER_PROCESS seeds each (what a seed leaves behind stays bounded), by a fresh
    # pool per block: the executor's own max_tasks_per_child deadlocks on Python 3.11 once a worker it
    # retired is not replaced (CPython gh-115634; a 500-seed run hung after 400 seeds, twice).
    block = jobs * SEEDS_PER_PROCESS
    for first_seed in range(0, len(seeds), block):
        pending = seeds[first_seed : first_seed + block]
        deaths = 0
        while pending:
            try:
                with concurrent.futures.ProcessPoolExecutor(
                    max_workers=jobs, mp_context=context, initializer=_init
                ) as pool:
                    for seed, ok, report, _virtual, _steps in pool.map(one, pending, chunksize=4):
                        pending = pending[1:]
                        done += 1
                        if not ok:
                            failures.append((seed, report))
                            print(f"FAIL {seed[0]}:{seed[1]}: {_first_problem(report)}", flush=True)
                            if stop_after is not None and len(failures) >= stop_after:
                                pool.shutdown(cancel_futures=True)
                                return _summary(failures, done, started, jobs)
                        if done % 100 == 0:
                            rate = done / (time.monotonic() - started)
                            print(
                                f"... {done}/{len(seeds)} seeds, {len(failures)} failed, {rate:.2f} seeds/s",
                                flush=True,
                            )
            except concurrent.futures.process.BrokenProcessPool as exc:
                pending, deaths = _after_a_death(pending, deaths, exc, failures)
    return _summary(failures, done, started, jobs)


def _after_a_death(
    pending: list[Run], deaths: int, exc: BaseException, failures: list[tuple[Run, str]]
) -> tuple[list[Run], int]:
    """A pool process died (killed from outside, or a seed that kills its interpreter): the seeds
    it left are run again in a fresh pool, up to ``POOL_RETRIES`` times; then each is a failure."""
    deaths += 1
    if deaths <= POOL_RETRIES:
        print(
            f"... a pool process died ({exc}); running the {len(pending)} seeds left of its block again",
            flush=True,
        )
        return pending, deaths
    for seed in pending:
        report = f"problems:\n  its process died {deaths} times running its block ({exc})"
        failures.append((seed, report))
        print(f"FAIL {seed[0]}:{seed[1]}: {_first_problem(report)}", flush=True)
    return [], deaths


def _summary(failures: list[tuple[Run, str]], done: int, started: float, jobs: int) -> list[tuple[Run, str]]:
    elapsed = time.monotonic() - started
    print(
        f"{done} seeds in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.2f} seeds/s on {jobs} processes): {len(failures)} failed"
    )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation.run", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, help="run this one seed and print its verdict")
    parser.add_argument(
        "--mix",
        default="default",
        help="the fault mix (default, poison, standby, time, redrive, rescale, static, retention, classic; suite)",
    )
    parser.add_argument("--trace", action="store_true", help="with --seed: print the whole trace")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--list",
        help="run these seeds instead, comma-separated, each SEED or MIX:SEED (e.g. classic:187,time:12)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per core)"
    )
    parser.add_argument("--stop-after", type=int, help="stop after this many failures")
    parser.add_argument(
        "--nice", type=int, default=0, help="lower this run's CPU priority by this much (its processes too)"
    )
    args = parser.parse_args(argv)
    _ensure_hash_seed()
    if args.nice:
        os.nice(args.nice)
    if args.seed is not None:
        _quiet()
        from tests.simulation.world import run_seed  # noqa: PLC0415

        started = time.monotonic()
        result = run_seed(args.seed, args.mix)
        print(result.report(trace_lines=len(result.trace) if args.trace else 200))
        if result.ok and args.trace:
            print("\n".join(result.trace))
        print(f"({time.monotonic() - started:.2f}s real, counts {result.counts})")
        return 0 if result.ok else 1
    from tests.simulation.mixes import MIXES, parse_runs, suite  # noqa: PLC0415

    if args.list:
        seeds = parse_runs(args.list, args.mix)
    elif args.mix == "suite":
        seeds = suite(args.seeds, args.first)
    elif args.mix in MIXES:
        seeds = [(args.mix, n) for n in range(args.first, args.first + args.seeds)]
    else:
        parser.error(f"no mix {args.mix!r} (the mixes: {', '.join(MIXES)}, and suite)")
    failures = run_many(seeds, args.jobs, stop_after=args.stop_after)
    for _seed, report in failures[:3]:
        print("\n" + report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
