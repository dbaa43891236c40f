"""The worker bench's output: the table of contenders, and a line per drain and latency phase."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.lib.phases import Result
from bench.lib.report import loadavg, print_markdown, say


# -- reporting ----------------------------------------------------------------------------------------
def report_drain(result: Result) -> None:
    d = result.drain
    if d is None:
        return
    say(
        f"  {result.name}: {d.events:,} events in {d.seconds:.1f}s = {d.rate:,.0f} events/s "
        f"(startup {d.startup_seconds:.1f}s, wall {d.wall_seconds:.1f}s), "
        f"CPU {d.cpu_per_100k:.1f} s/100k; broker CPU {d.broker_cpu_per_100k:.1f} s/100k; "
        f"all CPUs {d.machine_busy:.0%} busy"
    )


def report_latency(result: Result) -> None:
    lat = result.latency
    if lat is None:
        return
    say(
        f"  {result.name}: latency p50 {lat.p50_ms:.0f} ms, p99 {lat.p99_ms:.0f} ms, max {lat.max_ms:.0f} ms "
        f"({lat.seen:,}/{lat.firsts:,} first copies seen, {lat.sent:,} sent at {lat.achieved_rate:,.0f}/s); "
        f"CPU {lat.cpu_us_per_event:.0f} µs per event meanwhile"
    )


def transaction_stats(raw: dict[str, float]) -> dict[str, float]:
    count = raw.get("pipeline_transaction_commit_seconds_count", 0.0)
    seconds = raw.get("pipeline_transaction_commit_seconds_sum", 0.0)
    records = raw.get("pipeline_batch_records_sum", 0.0)
    return {
        "transactions": count,
        "records per transaction": round(records / count, 1) if count else float("nan"),
        "mean commit ms": round(seconds / count * 1000, 1) if count else float("nan"),
        "commit seconds (summed over partitions)": round(seconds, 2),
    }


def summary(results: list[Result]) -> list[dict[str, Any]]:
    """One row per contender: the table's figures, unformatted."""
    base = next((r.drain for r in results if r.name == "passthrough" and r.drain), None)
    rows = []
    for r in results:
        d, lat = r.drain, r.latency
        rate = d.rate if d else float("nan")
        rows.append(
            {
                "contender": r.label + (" (FAILED)" if r.error else ""),
                "events/s": rate,
                "ratio": rate / base.rate if d and base else float("nan"),
                "p50 ms": lat.p50_ms if lat else float("nan"),
                "p99 ms": lat.p99_ms if lat else float("nan"),
                "peak RSS MiB": r.peak_rss_mib,
                "CPU s/100k": d.cpu_per_100k if d else float("nan"),
                # Throughput ratio if each got a whole CPU: robust to other load on a shared machine.
                "CPU ratio": base.cpu_per_100k / d.cpu_per_100k if d and base else float("nan"),
            }
        )
    return rows


def print_table(args: argparse.Namespace, results: list[Result], info: dict[str, str], work: Path) -> None:
    """The worker bench's table, the machine, and each contender's drain in a line."""
    header = (
        "contender",
        "events/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "peak RSS MiB",
        "CPU s/100k",
        "CPU ratio",
    )
    rows = [
        (
            row["contender"],
            f"{row['events/s']:,.0f}",
            f"{row['ratio']:.2f}",
            f"{row['p50 ms']:.0f}",
            f"{row['p99 ms']:.0f}",
            f"{row['peak RSS MiB']:.0f}",
            f"{row['CPU s/100k']:.1f}",
            f"{row['CPU ratio']:.2f}",
        )
        for row in summary(results)
    ]
    print()
    print(
        f"Worker benchmark: {args.events:,} events ({args.dup_ratio:.0%} duplicates, 1-2 KB bodies), "
        f"{args.partitions} partitions, latency at {args.latency_rate:,.0f} events/s for {args.latency_seconds:g}s"
    )
    print_markdown(header, rows)
    print("CPU ratio: the passthrough's CPU s/100k over the row's (the ratio if each had a CPU of its own)")
    print()
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Python {info['python']}, "
        f"Kafka {info['kafka']} (one local KRaft broker), {info['libraries']}; load average at end {loadavg()}"
    )
    for r in results:
        if r.drain:
            d = r.drain
            print(
                f"{r.name}: startup {d.startup_seconds:.1f}s, drain {d.seconds:.1f}s, "
                f"wall {d.wall_seconds:.1f}s; during the drain: process {d.cpu_seconds / d.seconds:.0%} "
                f"of a CPU, broker {d.broker_cpu_seconds / d.seconds:.0%} of a CPU "
                f"({d.broker_cpu_per_100k:.1f} s/100k), all {info['nproc']} CPUs {d.machine_busy:.0%} busy"
                + (f"; preload {r.preload}" if r.preload else "")
            )
        if r.error:
            print(f"{r.name}: FAILED: {r.error.splitlines()[0]}")
    print(f"logs: {work}", flush=True)
