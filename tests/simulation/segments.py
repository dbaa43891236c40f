"""A partition's log segments and the broker's retention by time, as Kafka's log manager applies it.

Kafka keeps a partition as segments, rolls a new one when the active one is full
(``segment.bytes``), and, for a topic whose ``cleanup.policy`` includes ``delete``, deletes
whole segments, never the active one, once a segment's largest timestamp is more than
``retention.ms`` behind the broker's clock; the log start offset then moves to the next
segment's first offset. A record's timestamp is what its producer stamped, or the append
time on a topic with ``message.timestamp.type=LogAppendTime``; a transaction marker's is the
broker's clock when it is written, and it counts in its segment's largest timestamp as any
batch does (Kafka writes markers with the current time). So in a transactional changelog a
segment is as young as its last marker, whatever its records were stamped with; only once
the log cleaner has removed the markers (``delete.retention.ms`` after their transaction)
would old stamps on the records decide. The model deletes only below the last stable
offset (what a read_committed reader has decided), and does not compact.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Segment:
    """One segment: its first offset, its bytes and its largest timestamp."""

    base_offset: int
    size: int = 0
    max_timestamp: int = -1


@dataclass
class Segments:
    """The segments of one partition's log, oldest first (the last is the active one)."""

    segments: list[Segment] = field(default_factory=lambda: [Segment(0)])

    def appended(self, base_offset: int, size: int, max_timestamp: int, segment_bytes: int) -> None:
        """A batch of ``size`` bytes went in at ``base_offset``: it rolls a new segment when the active
        one has no room for it."""
        active = self.segments[-1]
        if active.size and active.size + size > segment_bytes:
            active = Segment(base_offset)
            self.segments.append(active)
        active.size += size
        active.max_timestamp = max(active.max_timestamp, max_timestamp)

    def expire(self, now_ms: int, retention_ms: int, upto: int) -> int | None:
        """Delete the segments retention takes (largest timestamp more than ``retention_ms`` before
        ``now_ms``, ending at or before ``upto``, never the active one); the new log start offset, or
        None when none went."""
        start = None
        segments = self.segments
        while (
            len(segments) > 1
            and now_ms - segments[0].max_timestamp > retention_ms
            and segments[1].base_offset <= upto
        ):
            segments.pop(0)
            start = segments[0].base_offset
        return start
