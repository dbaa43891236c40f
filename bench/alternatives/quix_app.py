"""The quixstreams alternative: an Application deduping with its RocksDB state, exactly once.

    python bench/alternatives/quix_app.py --bootstrap B --input T --output U --group G \
        --state-dir D --commit-interval 0.1

As quix's docs show stateful processing: ``sdf.apply(func, stateful=True)``
where ``func`` gets the per-key ``State`` (state is scoped to the message key,
so ``state.get("seen")`` asks "was this key seen before"), then
``sdf.filter`` and ``sdf.to_topic``. quixstreams 3.28 has no built-in dedupe
operator. ``processing_guarantee="exactly-once"``: each checkpoint commits the
produced records, the changelog and the offsets in one Kafka transaction and
flushes RocksDB after it. quix handles SIGTERM/SIGINT itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quixstreams import Application, State

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.alternatives
from bench.alternatives.common import command

TTL_MS = 7 * 86400 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds (quix default 5)")
    parser.add_argument("--guarantee", default="exactly-once")
    args = parser.parse_args()

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        consumer_extra_config={"session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000},
        loglevel="INFO",
    )
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(args.output, key_serializer="bytes", value_serializer="bytes")

    def dedupe(
        value: bytes, key: bytes, timestamp: int, headers: Any, state: State[Any, Any]
    ) -> bytes | None:
        first_seen = state.get("seen")
        if first_seen is not None and timestamp - first_seen < TTL_MS:
            return None
        state.set("seen", timestamp)
        return command(key, value, headers)

    sdf = app.dataframe(source)
    sdf = sdf.apply(dedupe, stateful=True, metadata=True)
    sdf = sdf.filter(lambda value: value is not None)
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
