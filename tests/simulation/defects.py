"""The defects the simulation was built to find, each re-introduced into a copy of ``pipeline/``.

``python -m tests.simulation.defects N [--mix M] [--seed S]`` copies ``pipeline/`` into a
temporary directory, undoes fix N there (the exact change below, the code as it stood before
the fix, or, for 9-15, a plausible bug of the expiry and redrive paths), and runs simulation
seeds of mix M against that copy: each must fail, while the same seeds pass on the code as
it is. ``tests/simulation/test_defects.py`` checks that for the seed
``docs/reliability.md`` records for each. A patch that no longer applies means the code it
undoes changed: update the patch to undo the fix as the code now has it.

``python -m tests.simulation.defects --census --mix suite --seeds 300 [N ...]`` runs each defect
(default: all) against the same seeds, each until one fails, and prints which run caught it
first and after how many runs, or that none did (docs/reliability.md, "The census").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

Patch = tuple[str, str, str]  # file under pipeline/, text of the fix, text before it

DEFECTS: dict[int, tuple[str, list[Patch]]] = {
    1: (
        "a record whose outputs the broker refuses stops its partition",
        [
            (
                "state/transaction.py",
                "        bounds = self.timestamps.get(topic)\n        if restamp or bounds is not None:",
                "        bounds = None\n        if False:",
            ),
            (
                "worker/poison.py",
                "        earlier = self.poison.get(start)\n        if earlier is not None and earlier.reason != RESTAMP:",
                "        earlier = None\n        if False:",
            ),
            (
                "worker/poison.py",
                "        if earlier is None and isinstance(cause, InvalidTimestampError):",
                "        if False:",
            ),
            (
                "worker/executor.py",
                "            outcome.replace_producer = self.txn.producer.needs_replacing",
                "            outcome.replace_producer = False",
            ),
        ],
    ),
    2: (
        "one record can expire the whole seen-set",
        [
            (
                "worker/event_stage.py",
                "        if timestamp > self._horizon:\n            timestamp = self._skewed(delivery, item.key)\n",
                "",
            ),
            (
                "worker/event_stage.py",
                "            txn.consumed(delivery.offset)",
                "            txn.consumed(delivery.offset)\n            txn.observe(delivery.timestamp)",
            ),
            (
                "worker/effect_stage.py",
                "        timestamp = min(delivery.timestamp, self._horizon)",
                "        timestamp = delivery.timestamp",
            ),
        ],
    ),
    3: (
        "a store that outlived its changelog is trusted",
        [
            (
                "state/store_meta.py",
                "            if (stored.cluster, stored.changelog_id) != (identity.cluster, identity.changelog_id):",
                "            if False:",
            ),
            (
                "state/restore.py",
                "    if start > end:\n",
                "    if start > end:\n        return True\n",
            ),
        ],
    ),
    4: (
        "a zombie's offsets carry no group generation (TxnOffsetCommit v0, as aiokafka sends it)",
        [
            (
                "kafka/transactional.py",
                "        await self._settle(self._send_offsets(self._producer, offsets, group))",
                "        await self._settle(self._producer.send_offsets_to_transaction(dict(offsets), group.group_id))",
            ),
        ],
    ),
    5: (
        "a reopen racing a rebalance leaves a partition behind",
        [
            (
                "worker/tasks.py",
                "        return not self._rebalancing and tp in self.consumer.assignment()",
                "        return tp in self.consumer.assignment()",
            ),
            (
                "worker/tasks.py",
                "        if self.tasks.get(task.tp) is task:\n            del self.tasks[task.tp]\n        self._release(task)",
                "        self._release(task)",
            ),
            # the revoked tasks stayed in the table while they closed
            (
                "worker/tasks.py",
                "            task = self.tasks.pop(tp, None)",
                "            task = self.tasks.get(tp)",
            ),
        ],
    ),
    6: (
        "producer batches larger than their topic takes",
        [
            (
                "state/transaction.py",
                "        return self.producer.batch(min(self.limits.get(topic, MAX_MESSAGE_BYTES), MAX_MESSAGE_BYTES))",
                "        return self.producer.batch(MAX_MESSAGE_BYTES)",
            ),
        ],
    ),
    7: (
        "a new owner reads the committed offsets a pending transaction is about to move",
        [
            (
                "kafka/group.py",
                "        return await committed_stable(self.consumer, partitions)",
                "        return {tp: await self.consumer.committed(tp) for tp in partitions}",
            ),
        ],
    ),
    8: (
        "a new owner restores its store only to the changelog's last stable offset",
        [
            (
                "state/restore.py",
                "                end = await reader.log_end(changelog)",
                "                end = await reader.end(changelog)",
            ),
            (
                "state/restore.py",
                "            end = await (await self.reader()).log_end(changelog)",
                "            end = await (await self.reader()).end(changelog)",
            ),
        ],
    ),
    9: (
        "a claim lives only until the record's own timestamp plus the TTL (issue 34, defect 1)",
        [
            (
                "state/decision.py",
                "            expires_at=max(timestamp, stream_time) + ttl_ms,",
                "            expires_at=timestamp + ttl_ms,",
            ),
        ],
    ),
    10: (
        "buckets expire by the wall clock, not by stream time",
        [
            (
                "state/store.py",
                "            if (bucket + 1) * self.bucket_ms + grace > self.stream_time:",
                '            if (bucket + 1) * self.bucket_ms + grace > int(__import__("time").time() * 1000):',
            ),
        ],
    ),
    11: (
        "a key is still alive at its expiry time: an off-by-one at the TTL boundary",
        [
            (
                "state/decision.py",
                "        return timestamp < self.expires_at",
                "        return timestamp <= self.expires_at",
            ),
        ],
    ),
    12: (
        "a record replayed from the DLQ skips the seen-set",
        [
            (
                "worker/event_stage.py",
                "        existing = txn.staged(key_bytes) or known.get(key_bytes)",
                "        existing = None if replayed_from(delivery) else txn.staged(key_bytes) or known.get(key_bytes)",
            ),
        ],
    ),
    13: (
        "a replayed changelog takes stream time from the batches' timestamps",
        [
            (
                "state/replay.py",
                "                stream_time = max(stream_time, seen)",
                "                stream_time = max(stream_time, seen, batch.max_timestamp)",
            ),
        ],
    ),
    14: (
        "a bounded read (dlq replay) ends at a silence and reports success (issue 34, item 2)",
        [
            (
                "kafka/bounded_read.py",
                (
                    "                elif clock() - max(moved_at, connected_at) >= RECONNECT_AFTER:\n"
                    "                    await _closed(consumer)\n"
                    "                    consumer = None\n"
                ),
                "                elif clock() - moved_at >= 5.0:\n                    return\n",
            ),
        ],
    ),
    15: (
        "changelog records stamped with the record's time, not when written (issue 34, item 4)",
        [
            (
                "state/partition_transaction.py",
                "        written = int(self.txn.wall() * 1000)",
                "        written = entry.last_seen",
            ),
        ],
    ),
    16: (
        "a commit sent and answered with a fence is taken for aborted, and its records redone (issue 36)",
        [
            (
                "state/transaction.py",
                "            ending = True\n",
                "            ending = False\n",
            ),
        ],
    ),
    17: (
        "a rescale moves entries with their last_seen: a partition takes another's stream time (issue 34)",
        [
            (
                "ops/rescale.py",
                "moved = Entry.decode(value)._replace(last_seen=0).encode()",
                "moved = Entry.decode(value).encode() and value",
            ),
        ],
    ),
    18: (
        "a rescale moves entries in batches larger than the changelog takes (issue 34)",
        [
            (
                "ops/rescale.py",
                "linger_ms=20, max_batch_size=limit",
                "linger_ms=20",
            ),
        ],
    ),
    19: (
        "a rescale stops its consumers with aiokafka's stop, which lets a CancelledError out in an outage",
        [
            (
                "ops/rescale.py",
                "await stop_consumer(consumer)  # aiokafka lets a CancelledError out when the broker is away",
                "await consumer.stop()",
            ),
        ],
    ),
    20: (
        "a topic limit lowered under running workers is never read again: each record costs refused transactions",
        [
            (
                "worker/loop.py",
                "        if outcome.reread_limits:\n            await self._require(self._limits).reread()\n",
                "",
            ),
        ],
    ),
    21: (
        "a record whose handling raises is redone, never made poison: its partition stops for good",
        [
            (
                "worker/poison.py",
                "        self.poison[offset] = Poison(reason, error)\n        return True",
                "        return True",
            ),
        ],
    ),
    22: (
        "a standby whose rounds raise a bug lives on: it logs, retries, and is never warm",
        [
            (
                "worker/standbys.py",
                "            on_applied=self.context.metrics.standby_records.inc,",
                "            on_applied=self.context.metrics.standby_records,",
            ),
        ],
    ),
    23: (
        "standbys given but never kept: every promotion replays the whole changelog",
        [
            (
                "worker/standbys.py",
                "        wanted = {tp for tp in self.assignor.standbys - active if tp.topic in self._changelogs}",
                "        wanted = {tp for tp in self.assignor.standbys - active if tp in self._changelogs}",
            ),
        ],
    ),
    24: (
        "a bisection that isolates at two records: the first of them is dead-lettered, whichever failed",
        [
            (
                "worker/poison.py",
                "        if count > 1:\n            self.limit = max(1, count // 2)",
                "        if count > 2:\n            self.limit = max(1, count // 2)",
            ),
        ],
    ),
    25: (
        "a record refused for its timestamp dead-lettered without a redo stamped with the current time",
        [
            (
                "worker/poison.py",
                "        if earlier is None and isinstance(cause, InvalidTimestampError):",
                "        if False:",
            ),
        ],
    ),
    27: (
        "a record alone judged on its first refusal: a one-off CORRUPT_MESSAGE stops the partition or dead-letters it",
        [
            (
                "worker/poison.py",
                "        if not again and (self.limit is None or count == 1):",
                "        if not again and self.limit is None:",
            ),
        ],
    ),
    28: (
        "a standby's store opened without its partition's identity: after a restart it claims nothing and is wiped",
        [
            (
                "worker/standbys.py",
                "            identity=self.identity(tp),\n            path=self._path(tp),",
                "            identity=None,\n            path=self._path(tp),",
            ),
        ],
    ),
    29: (
        "a standby's replayed records never counted: pipeline_standby_records_total stays 0",
        [
            (
                "worker/standbys.py",
                "            on_applied=self.context.metrics.standby_records.inc,\n        )",
                "        )",
            ),
        ],
    ),
    26: (
        "a worker pushed out of its group by a twin under its instance id exits with aiokafka's unreadable error",
        [
            (
                "worker/identity.py",
                "    if settings.instance_id is None or not internals.fenced_instance(exc):",
                "    if True:",
            ),
        ],
    ),
    30: (
        "a claim forgets its first copy's body: a different body under its key is a duplicate, never a conflict",
        [
            (
                "state/decision.py",
                "            body_hash=body_hash,\n        )\n        return Decision(Outcome.FIRST",
                "            body_hash=None,\n        )\n        return Decision(Outcome.FIRST",
            ),
        ],
    ),
    31: (
        "sliding expiry ignored: a duplicate never renews its key's claim",
        [
            (
                "state/decision.py",
                "    if sliding and timestamp + ttl_ms > expires_at:",
                "    if False:",
            ),
        ],
    ),
    32: (
        "a commit that may have taken redone like an aborted one: its tasks rewound, not reopened",
        [
            (
                "worker/executor.py",
                "        if isinstance(exc, CommitUncertainError):",
                "        if False:",
            ),
        ],
    ),
    33: (
        "dlq replay --dry-run sends the records it says it would replay",
        [
            (
                "ops/dlq.py",
                "    producer = None if dry_run else await started_producer(bootstrap)",
                "    producer = await started_producer(bootstrap)",
            ),
        ],
    ),
    34: (
        "a store behind its changelog's log start never moves to it: it asks for the deleted offset for ever",
        [
            (
                "state/replay.py",
                "            first,\n        )\n        self.position = first\n",
                "            first,\n        )\n",
            ),
        ],
    ),
    35: (
        "a bucket whose creation failed is deleted from a table it never entered: a KeyError escapes",
        [
            (
                "state/store.py",
                "                self._buckets.pop(bucket, None)\n",
                "                del self._buckets[bucket]\n",
            ),
        ],
    ),
    36: (
        "stores found on disk at start claim their positions unchecked: a store ahead of its changelog too",
        [
            (
                "worker/standbys.py",
                "            if end is not None and offset < end:\n",
                "            if True:\n",
            ),
        ],
    ),
    37: (
        "a task released before its restore checked its store leaves the store's unchecked position to claim",
        [
            (
                "worker/task.py",
                "            self.released_at = directory.release(store, wipe=self._wipe, name=self.name)\n",
                (
                    "            self.released_at = store.changelog_offset\n"
                    "            directory.release(store, wipe=self._wipe, name=self.name)\n"
                ),
            ),
        ],
    ),
    38: (
        "dlq replay waits for its sends but checks none: a record Kafka refused counts as replayed",
        [
            (
                "ops/dlq.py",
                "        exc = future.exception()\n",
                "        exc = None\n",
            ),
        ],
    ),
    39: (
        "a standby wipes a store past the stable end as stale: its last commit's markers on their way",
        [
            (
                "state/restore.py",
                "    return stable if offset < stable else await reader.log_end(changelog)\n",
                "    return stable\n",
            ),
        ],
    ),
    # -- plausible bugs of the kinds issue 34 names, never in the code: the census's first guesses
    40: (
        "expiry: a bucket dropped as soon as stream time passes its end, with no grace for late records",
        [
            (
                "state/store.py",
                "            if (bucket + 1) * self.bucket_ms + grace > self.stream_time:",
                "            if (bucket + 1) * self.bucket_ms > self.stream_time:",
            ),
        ],
    ),
    41: (
        "replay: the records of aborted transactions applied to the store",
        [
            (
                "state/replay.py",
                "        if batch.is_transactional and producer in aborted_producers:\n            return False",
                "        if False:\n            return False",
            ),
        ],
    ),
    42: (
        "replay: a restored store never takes stream time from the entries it applies",
        [
            (
                "state/replay.py",
                "                stream_time = max(stream_time, seen)\n",
                "                pass\n",
            )
        ],
    ),
    43: (
        "commit order: the store written before the Kafka commit",
        [
            (
                "state/transaction.py",
                "            ending = True\n            await self.producer.commit()\n",
                (
                    "            for part in parts:\n"
                    "                committed.parts[part.tp] = part.apply(self.last_offset(part.changelog_slot))\n"
                    "            ending = True\n"
                    "            await self.producer.commit()\n"
                ),
            ),
            (
                "state/transaction.py",
                (
                    "        try:\n"
                    "            for part in parts:\n"
                    "                committed.parts[part.tp] = part.apply(self.last_offset(part.changelog_slot))\n"
                    "        finally:\n"
                    "            self._reset()"
                ),
                "        self._reset()",
            ),
        ],
    ),
    44: (
        "commit order: the offset committed is the last record's, not the next one's",
        [
            (
                "state/transaction.py",
                "            offsets = {p.tp: p.next_offset for p in parts if p.next_offset is not None}",
                "            offsets = {p.tp: p.next_offset - 1 for p in parts if p.next_offset is not None}",
            ),
        ],
    ),
    45: (
        "poison: a command too large for its topic still claims its key",
        [
            (
                "worker/event_stage.py",
                (
                    "                    delivery, Invalid(RecordTooLargeError.reason, error, item.key, source, item.event_type)\n"
                    "                )\n"
                    "                return\n"
                ),
                (
                    "                    delivery, Invalid(RecordTooLargeError.reason, error, item.key, source, item.event_type)\n"
                    "                )\n"
                    "                txn.stage(key_bytes, entry, previous)\n"
                    "                return\n"
                ),
            ),
        ],
    ),
    46: (
        "expiry: a key written to the bucket of its previous copy's expiry",
        [
            (
                "state/store.py",
                "            bucket = entry.expires_at // width\n",
                "            bucket = (entry if previous is None else previous).expires_at // width\n",
            ),
        ],
    ),
    47: (
        "reopen: a store write that failed after the commit ignored, the task served on",
        [
            (
                "worker/task.py",
                "        if result.store_error is not None:\n            self.broken(result.store_error)",
                "        if False:\n            self.broken(result.store_error)",
            ),
        ],
    ),
    # -- found by the rule it tests: the start-up scan's under-claims (claims.py), 2026-12-07
    48: (
        "a store found on disk at start level with its changelog claims nothing (an off-by-one in the scan)",
        [
            (
                "worker/standbys.py",
                "            if end is not None and offset < end:\n",
                "            if end is not None and offset < end - 1:\n",
            ),
        ],
    ),
    49: (
        "the console's DLQ read takes 5 s of silence for the end (issue 34 item 2's kind, in the console)",
        [
            (
                "console/dlq_read.py",
                "            raise ReadIncompleteError(tp.topic, {tp.partition: (position, end)}, idle, None)\n",
                "            return\n",
            ),
            ("console/dlq_read.py", "IDLE_S = 30.0", "IDLE_S = 5.0"),
        ],
    ),
    # -- found by the rule it tests: every claim names its key's command (claim_names.py), 2026-12-07
    50: (
        "a duplicate's claim forgets the command its key made (what pipeline inspect shows)",
        [("state/decision.py", "        command=existing.command,\n", "        command=None,\n")],
    ),
    # -- found by the rule it tests: every claim counts its window's copies (claim_counts.py), 2026-12-07
    51: (
        "a duplicate's claim does not count it (what pipeline inspect shows)",
        [
            (
                "state/decision.py",
                "        duplicates=existing.duplicates + 1,\n",
                "        duplicates=existing.duplicates,\n",
            )
        ],
    ),
    52: (
        "a conflict's claim does not count it as a conflict (what pipeline inspect shows)",
        [
            (
                "state/decision.py",
                "        conflicts=existing.conflicts + 1 if conflict else existing.conflicts,\n",
                "        conflicts=existing.conflicts,\n",
            )
        ],
    ),
    # -- found by the rule it tests: no store is found corrupt (faults.StoreLedger), 2026-12-07 (the expiry
    # kind's ledger: bucket_width's `//` for `/`, a survivor of the time mix, whose TTLs keep the 1-hour floor)
    53: (
        "the bucket width is a float under a TTL above 10 hours: a reopened store cannot read it and is rebuilt",
        [
            (
                "state/store.py",
                "    return max(MIN_BUCKET_MS, max_ttl_ms // 10)\n",
                "    return max(MIN_BUCKET_MS, max_ttl_ms / 10)\n",
            )
        ],
    ),
    # -- found by the step it tests: the operator's look with --dry-run --since once a run is over
    # (operators.look_since), 2026-12-07, late: no seed used --since (the redrive kind's survivors)
    54: (
        "dlq replay --since leaves out a DLQ record stamped exactly at the time given",
        [
            (
                "records/dlq.py",
                "        if self.since_ms is not None and entry.timestamp < self.since_ms:\n",
                "        if self.since_ms is not None and entry.timestamp <= self.since_ms:\n",
            )
        ],
    ),
    # -- found by the same change: a replay that exits 0 replays no record its filter leaves (operators.py)
    55: (
        "dlq replay replays every DLQ record, whatever --reason says",
        [
            (
                "records/dlq.py",
                "        if self.reasons and entry.reason not in self.reasons:\n",
                "        if False:\n",
            )
        ],
    ),
}

#: Run in the child: the editable install's import hook removed, the copy first on the path.
_CHILD = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path[:0] = [{copy!r}, {root!r}]
import pipeline
assert pipeline.__file__.startswith({copy!r}), pipeline.__file__
from tests.simulation import run
sys.exit(run.main({args!r}))
"""


def make_copy(defect: int, where: Path) -> Path:
    """``pipeline/`` copied under ``where`` with defect ``defect`` re-introduced; returns the copy's parent."""
    target = where / "pipeline"
    shutil.copytree(ROOT / "pipeline", target, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name, fixed, before in DEFECTS[defect][1]:
        path = target / name
        text = path.read_text()
        if fixed not in text:
            raise SystemExit(f"defect {defect}: {name} no longer has the fix this patch undoes:\n{fixed}")
        path.write_text(text.replace(fixed, before))
    return where


def run_with_defect(
    defect: int, args: list[str], *, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tests.simulation.run <args>`` (in one process) against a copy with ``defect``."""
    with tempfile.TemporaryDirectory(prefix=f"defect-{defect}-") as tmp:
        copy = make_copy(defect, Path(tmp))
        code = _CHILD.format(copy=str(copy), root=str(ROOT), args=[*args, "--jobs", "1"])
        env = dict(os.environ, PYTHONHASHSEED="0")
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def census(defects: list[int], mix: str, seeds: int, first: int) -> int:
    """Run each defect against the same seeds until one fails; print one line each: the run that caught it and
    how many runs that took, or that none did. Returns how many no run caught."""
    missed = 0
    for defect in defects:
        started = time.monotonic()
        args = ["--mix", mix, "--seeds", str(seeds), "--first", str(first), "--stop-after", "1"]
        out = run_with_defect(defect, args, timeout=36000).stdout.splitlines()
        failed = next((line for line in out if line.startswith("FAIL ")), None)
        ran = next((line.split()[0] for line in reversed(out) if " seeds in " in line), "?")
        took = f"{ran} runs, {time.monotonic() - started:.0f}s"
        if failed is None:
            missed += 1
            print(f"defect {defect}: not caught ({took})", flush=True)
        else:
            run, _, problem = failed[5:].partition(": ")
            print(f"defect {defect}: caught by {run} ({took}): {problem[:160]}", flush=True)
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation.defects", description=__doc__.splitlines()[0]
    )
    parser.add_argument("defect", type=int, nargs="*", help="the defects (--census: default all)")
    parser.add_argument(
        "--mix", default="default", help="the fault mix of the seeds (tests/simulation/mixes.py; suite)"
    )
    parser.add_argument("--seed", type=int, help="run this seed (default: search --seeds from --first)")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument(
        "--census", action="store_true", help="each defect against the same seeds: which run catches it first"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.defect) - set(DEFECTS))
    if unknown:
        parser.error(f"no defect {unknown[0]} (the defects: 1-{max(DEFECTS)})")
    if args.census:
        return 1 if census(args.defect or sorted(DEFECTS), args.mix, args.seeds, args.first) else 0
    if len(args.defect) != 1:
        parser.error("name one defect (or several with --census)")
    run_args = ["--mix", args.mix] + (
        ["--seed", str(args.seed)]
        if args.seed is not None
        else ["--seeds", str(args.seeds), "--first", str(args.first), "--stop-after", "3"]
    )
    result = run_with_defect(args.defect[0], run_args, timeout=36000)
    out = result.stdout
    print(out if len(out) < 20000 else out[:6000] + "\n...\n" + out[-6000:], end="")
    print(result.stderr[-3000:], end="", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
