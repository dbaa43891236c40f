"""What the consumer's CRC32C check costs per record, apart from the worker (``--check-crcs``).

    .venv/bin/python bench/crc_cost.py                # 60,000 records of bench/worker_bench.py's workload
    .venv/bin/python bench/crc_cost.py --events 20000

The records of ``bench/worker_bench.py``'s workload (1-2 KB Stripe-like bodies, 30%
re-sends, the worker's input headers) are encoded into transactional record batches of
2,000 as a producer writes them, with aiokafka's C batch builder. Then, per batch and
best of ``--repeat`` runs, as aiokafka's fetcher does with each batch it receives:
``validate_crc()`` (what ``check_crcs=True`` adds), and reading every record out of the
batch (what the consumer does in any case). Printed: µs per record for each, and the
check as a share of the read. Compare the check with the worker's CPU per event under load
(``bench/worker_bench.py``; the current figures of both are in ``docs/benchmarks.md``). No broker.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.lib
from bench.lib.workload import make_stream, source_headers

BATCH = 2000


def batches(events: int, seed: int) -> list[bytes]:
    """The workload's records in transactional batches of ``BATCH``, as the broker stores them."""
    stream = make_stream(random.Random(seed), events, 0.3, min_size=1000, max_size=2000)
    now = int(time.time() * 1000)
    headers = source_headers(now)
    out = []
    for start in range(0, len(stream.order), BATCH):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=1,
            producer_id=1,
            producer_epoch=0,
            base_sequence=start,
            batch_size=1 << 30,
        )
        for offset, index in enumerate(stream.order[start : start + BATCH]):
            builder.append(
                offset, timestamp=now, key=stream.keys[index], value=stream.bodies[index], headers=headers
            )
        out.append(bytes(builder.build()))
    return out


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` timed runs (the others lost time to the shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    args = parser.parse_args()
    data = batches(args.events, args.seed)
    records = sum(DefaultRecordBatch(b).next_offset - DefaultRecordBatch(b).base_offset for b in data)
    size = sum(len(b) for b in data)

    def check() -> None:
        for buf in data:
            if not DefaultRecordBatch(buf).validate_crc():
                raise SystemExit("a batch built here failed its own CRC check")

    def read() -> None:
        for buf in data:
            for record in DefaultRecordBatch(buf):
                _ = (record.key, record.value, record.headers)

    check_s = best_seconds(check, args.repeat)
    read_s = best_seconds(read, args.repeat)
    print(
        f"{records:,} records in {len(data)} batches, {size / records:,.0f} bytes per record; best of {args.repeat}"
    )
    print("| step | µs per record | MB/s | share of the read |")
    print("|---|---:|---:|---:|")
    print(
        f"| read every record (always) | {read_s / records * 1e6:.2f} | {size / read_s / 1e6:,.0f} | 1.00 |"
    )
    print(
        f"| validate_crc (check_crcs=True) | {check_s / records * 1e6:.2f} | {size / check_s / 1e6:,.0f}"
        f" | {check_s / read_s:.2f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
