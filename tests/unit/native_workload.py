"""A worker partition's whole output for a fixed mix of records, as one digest (run as a module).

    python -m tests.unit.native_workload        # the build installed (compiled hot modules)
    PIPELINE_PURE_PYTHON=1 python -m tests.unit.native_workload   # their Python sources

Prints one JSON line: which build ran and a sha256 over every record committed
(topic, partition, key, value, headers, timestamp), the committed offset and the
store's entries. ``test_native.py`` compares the two builds' lines.
"""

from __future__ import annotations

from tests.native_source import load_sources_if_asked

load_sources_if_asked()  # before the fakes import the hot modules

import asyncio  # noqa: E402
import hashlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import orjson  # noqa: E402
import pytest  # noqa: E402
from aiokafka.structs import ConsumerRecord  # noqa: E402

from pipeline import native  # noqa: E402
from tests.unit.worker.fakes import (  # noqa: E402
    TOPICS,
    ProducerFactory,
    body,
    install,
    keys_for,
    make_partition,
    record,
)


def workload() -> list[ConsumerRecord[bytes, bytes]]:
    """Firsts, duplicates, a conflict, reroutes, bad bodies, a missing source, a big body and a replay."""
    own = keys_for(0, 40)
    other = keys_for(1, 3)
    values: list[tuple[str | None, bytes | None, list[tuple[str, bytes]] | None]] = []
    values += [(key, None, None) for key in own[:30]]  # firsts
    values += [(key, None, None) for key in own[:10]]  # duplicates
    values.append((own[0], body(own[0], pad=3), None))  # a conflict: same key, another body
    values += [(key, None, None) for key in other]  # owned by partition 1: rerouted
    values.append((own[30], b"{not json", None))
    values.append((own[31], b"[1, 2]", None))  # JSON, not an object
    values.append((own[32], None, []))  # no source header
    values.append((own[33], body(own[33], pad=200_000), None))  # big, still within the limits
    values.append((own[34], body(own[34]).replace(b"charge.succeeded", b"invoice.paid"), None))
    replayed = [("source", b"stripe"), ("received-at", b"1700000000000"), ("replayed-from", b"dlq:0:7")]
    values.append((own[35], None, replayed))
    return [
        record(offset, key, value=value, headers=headers)
        for offset, (key, value, headers) in enumerate(values)
    ]


async def run(state_dir: Path) -> dict[str, object]:
    monkeypatch = pytest.MonkeyPatch()
    producers = ProducerFactory()
    install(monkeypatch, producers=producers)
    part = make_partition(state_dir)
    await part.open()
    records = workload()
    for start in range(0, len(records), 16):
        part.feed(records[start : start + 16])
        await part.work()
        await part.commit()
    producer = producers.of(0)
    digest = hashlib.sha256()
    for sent in producer.committed:
        digest.update(
            orjson.dumps(
                [sent.topic, sent.partition, sent.key, sent.value, sent.headers, sent.timestamp],
                default=lambda b: b.hex(),
            )
        )
    store = part.store
    keys = sorted({r.key for r in records if r.key is not None})
    entries = store.get_many(keys) if store is not None else {}
    for key in keys:
        entry = entries.get(key)
        digest.update(key + b"=" + (entry.encode() if entry is not None else b"-"))
    outcomes = sorted(s.json()["outcome"] for s in producer.committed_to(TOPICS.audit))
    await part.close(commit=False)
    monkeypatch.undo()
    return {
        "compiled": [name for name in native.COMPILED if not sys.modules[name].__file__.endswith(".py")],  # type: ignore[union-attr]
        "committed_offset": producer.committed_offset(),
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "sha256": digest.hexdigest(),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="native-workload-") as state:
        print(orjson.dumps(asyncio.run(run(Path(state)))).decode())


if __name__ == "__main__":
    main()
