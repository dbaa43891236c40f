"""Worker benchmark: the exactly-once dedupe worker against a plain aiokafka passthrough.

    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:19092 --events 200000 --partitions 4
    .venv/bin/python bench/worker_bench.py --bootstrap 127.0.0.1:19092 --quick   # under ~2 minutes

In one run, on one broker and the same data, for each contender:

1. fresh uniquely named topics (and consumer group, and state directory);
2. the same N Stripe-like webhook records (1-2 KB JSON bodies with nested
   objects, 30% duplicates: the same key and body re-sent later in the
   stream, keyed ``stripe:evt_...``, header ``source: stripe``) produced in
   the same order into its input topic *before* it starts (a backlog), by an
   idempotent producer that fills one batch per partition;
3. the contender as a subprocess: ``passthrough`` (``bench/passthrough.py``,
   aiokafka consume -> ``producer.send`` -> periodic commit, at least once, no
   state), ``worker`` (``python -m pipeline worker``, exactly once) and
   ``worker-preloaded`` (the worker whose store already holds ``--preload``
   keys from an earlier run over as many unique small events);
4. throughput: events/s to drain the backlog, measured from the first handled
   record to the last (startup - interpreter, group join, store open - is
   reported apart), where "handled" is what a read_committed reader can see:
   the passthrough's output end offsets (LSO), the worker's consumer-group
   offsets, which it commits inside the same transaction as its outputs;
   peak RSS (VmHWM) and CPU seconds per 100k events (utime+stime over the
   drain) from /proc/<pid>;
5. latency: with the contender caught up, records are produced at a fixed rate
   and a read_committed consumer matches each output record's key to its
   first copy's send time (the record timestamp): p50 and p99 of that delay;
   the reader has fetched every partition once before the first send, so its
   own start is not counted as the contender's latency;
6. a check of the outputs (counts of first/duplicate outcomes, one command per
   key, every record passed through), then the contender is stopped.

It prints one table and the machine, deletes its topics at the end (also on
Ctrl-C) and keeps the contenders' logs in ``--work-dir``. "ratio" is events/s
over the passthrough's; "CPU ratio" is the passthrough's CPU per event over
the contender's, which is what "ratio" would be if each process had a CPU of
its own (both are single-threaded and CPU-bound), so it survives other load on
a shared machine. Also printed per contender: the broker's CPU and the whole
machine's over the drain, and the worker's own transaction metrics (records
per transaction, mean commit time) scraped from its ``--metrics-port``.

``--profile-worker`` runs the workers under pyinstrument (profile only: not
for the table). The run itself is ``bench/lib/worker_runs.py``; the workload,
broker, phases and report it shares with the other benches are in ``bench/lib/``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.lib
from bench.lib.worker_runs import Bench, parse_args


def main() -> int:
    args = parse_args()
    bench = Bench(args)
    try:
        results = asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("interrupted: processes stopped, topics deleted", file=sys.stderr)
        return 130
    return 0 if all(r.error is None and r.checks.get("ok", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
