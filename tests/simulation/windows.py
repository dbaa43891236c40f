"""The TTL windows of every key: which copy of a key must be ``first``, which a duplicate, and which may be either.

The worker's promise, exact to what it guarantees (``docs/design.md`` section 5, "Time";
``pipeline/state/decision.py``, ``store.py``), which :class:`Windows` checks copy by copy, in
each partition's order, against the outcome its audit record gives:

1. *Record time is bounded.* A copy is decided at its record timestamp, but never later than
   the deciding worker's wall clock plus ``--max-clock-skew``. That clock read happened after the
   record was appended and before its audit record was: so the copy's time ``e`` lies in
   ``[min(ts, appended + skew + least clock offset), min(ts, audited + skew + greatest clock
   offset)]``, the offsets those of the seed's clock jumps (and 0).
2. *Stream time* of a partition before a copy is the largest ``e`` of the accepted copies
   before it (first, duplicate or conflict; never an invalid or rerouted one): an interval
   ``[lo, hi]`` as the ``e`` are. A restore or a standby takes it from the entries, so a
   store never runs ahead of it; a rescale keeps it too (the entries it moves carry no
   ``last_seen``, so a partition never takes another's stream time), and a partition the
   rescale added starts at none.
3. *A claim* made by a ``first`` copy at time ``e`` lives until ``max(e, stream time) + TTL``
   (the audit's ``expires_at``, checked to be within those bounds), whatever the record's age:
   an old redelivery or a redrive claims for a whole TTL from now in stream time.
4. *A claim is kept* in the store until stream time passes the end of its expiry bucket
   plus one bucket of grace: its bucket ``b = expires_at // width`` is dropped only once the
   store's stream time is at least ``(b + 2) * width``. While the partition's stream time
   (``hi``) is below that, the claim is certainly there; at or above it, it may be gone.
   A store rebuilt from the changelog has it too: the broker deletes a changelog record only a
   TTL and a day after it was written, and no run lets stream time fall a day further behind
   the clock, the one case ``docs/operations.md`` ("Expiry and disk") leaves open.
5. *So, for a copy of a key with a claim expiring at X*: if ``e`` is certainly ``>= X`` it
   must be ``first`` (a new window, one new command); if ``e`` is certainly ``< X`` and the
   claim certainly kept, it must be a duplicate (no second command in one window); otherwise
   either. A key with no claim yet must be ``first``. X is the model's own (rule 3 from the
   copy's time and the stream time): the audit's ``expires_at`` only narrows it where it agrees,
   so a worker that claims too short is judged by the window it owed, not by the one it wrote.
6. *A copy that is not first is a conflict exactly when its body differs from the body of the
   copy that made the claim* (the workload's ``data.variant``; ``pending_webhooks`` differs between
   attempts and is volatile to the check): a conflict counts as a duplicate for rules 1-5, but a
   claim that forgot its first body, or a check that compares the wrong bodies, is seen here.
   Checked where the stage compares bodies (the event stage; the effect stage does not).
7. *Sliding expiry* (a source with ``expiry = "sliding"``: half the seeds of the time mix): a
   copy that is not first moves its claim's expiry to ``e + TTL`` when that is later, so the
   claim expires at ``max(X, e + TTL)``; the audit's ``expires_at`` must lie within those bounds
   and narrows the claim to it. Rules 4 and 5 then judge the next copies by the moved claim.
   A fixed claim never moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

FIRST = "first"
DUPLICATE_LIKE = frozenset({"duplicate", "conflict"})


@dataclass
class Stream:
    """A partition's stream time as an interval (the ``e`` of its accepted copies: rule 2)."""

    lo: int = 0
    hi: int = 0


@dataclass(frozen=True)
class Copy:
    """One accepted copy of a key, as its record and audit record show it."""

    where: str  # for a problem's text: topic-partition@offset (sim id)
    key: str  # the key it is deduped by
    timestamp: int
    appended: int  # ms: its record appended (the decision came after)
    audited: int  # ms: its audit record appended (the decision came before)
    outcome: str
    first_seen: int | None
    expires_at: int | None
    ttl: int
    variant: int | None = None  # which body the workload sent (rule 6); None: not known
    sliding: bool = False  # its source's expiry slides (rule 7)


@dataclass(frozen=True)
class Claim:
    """A claim as the model knows it: when it expires, between ``expires_lo`` and ``expires_hi`` (one value
    once the audit's ``expires_at`` agrees with rule 3; never the worker's word where it does not)."""

    expires_lo: int
    expires_hi: int
    first_seen: int
    where: str
    variant: int | None = None  # the body of the copy that claimed (rule 6)

    @property
    def expires_at(self) -> str:
        lo, hi = self.expires_lo, self.expires_hi
        return str(lo) if lo == hi else f"[{lo}, {hi}]"


@dataclass
class Windows:
    """The claims of one stage's keys, and the checks of rules 1-7 (see the module docstring)."""

    width: int  # the expiry buckets' width, ms
    skew: int  # --max-clock-skew, ms
    offsets: tuple[int, int]  # the least and greatest wall clock offset of any worker, ms
    bodies: bool = False  # rule 6 holds: the stage tells a conflict from a duplicate
    claims: dict[str, Claim] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    firsts: dict[str, int] = field(default_factory=dict)  # first outcomes per key
    judged: dict[str, int] = field(
        default_factory=dict
    )  # copies by what rule 5 allowed: new, renewed, kept, either

    def bounds(self, copy: Copy) -> tuple[int, int]:
        """Rule 1: the least and greatest time ``copy`` can have been decided at."""
        least = copy.appended + self.skew + self.offsets[0]
        most = max(copy.audited + self.skew + self.offsets[1], least)
        return min(copy.timestamp, least), min(copy.timestamp, most)

    def expected(
        self, copy: Copy, stream: Stream, claim: Claim | None, e_lo: int, e_hi: int
    ) -> frozenset[str]:
        """Rule 5: the outcomes ``copy`` may have ("first", "duplicate")."""
        if claim is None or e_lo >= claim.expires_hi:
            return frozenset({FIRST})
        kept = stream.hi < self.kept_until(claim)
        if e_hi < claim.expires_lo and kept:
            return frozenset({"duplicate"})
        return frozenset({FIRST, "duplicate"})

    def decide(self, copy: Copy, stream: Stream) -> None:
        """Check one copy in its partition's order, then take its outcome into the model."""
        e_lo, e_hi = self.bounds(copy)
        claim = self.claims.get(copy.key)
        allowed = self.expected(copy, stream, claim, e_lo, e_hi)
        kind = (
            "either"
            if len(allowed) > 1
            else "kept"
            if FIRST not in allowed
            else "new"
            if claim is None
            else "renewed"
        )
        self.judged[kind] = self.judged.get(kind, 0) + 1
        outcome = "duplicate" if copy.outcome in DUPLICATE_LIKE else copy.outcome
        if outcome not in allowed:
            self._wrong(copy, stream, claim, e_lo, e_hi)
        if outcome == FIRST:
            self._first(copy, stream, e_lo, e_hi)
            return
        self._body(copy, claim)
        if claim is not None:
            self._renew(copy, claim, e_lo, e_hi)
        stream.lo, stream.hi = max(stream.lo, e_lo), max(stream.hi, e_hi)

    def _renew(self, copy: Copy, claim: Claim, e_lo: int, e_hi: int) -> None:
        """A copy that is not first keeps its claim's expiry, or with sliding expiry moves it (rule 7)."""
        lo, hi = claim.expires_lo, claim.expires_hi
        if copy.sliding:
            lo, hi = max(lo, e_lo + copy.ttl), max(hi, e_hi + copy.ttl)
        expires = copy.expires_at
        if expires is not None and not lo <= expires <= hi:
            moved = (
                f"; a copy at {e_lo if e_lo == e_hi else f'[{e_lo}, {e_hi}]'} moves it to "
                if copy.sliding
                else ""
            )
            wanted = str(lo) if lo == hi else f"[{lo}, {hi}]"
            self.fail(
                f"{copy.key}: {copy.where} is a duplicate of a claim expiring at {expires}, but the claim "
                f"made by {claim.where} expires at {claim.expires_at}{moved}{wanted if moved else ''}"
            )
            return
        if copy.sliding:
            lo, hi = (expires, expires) if expires is not None else (lo, hi)
            if hi > claim.expires_hi:
                self.judged["slid"] = self.judged.get("slid", 0) + 1  # copies that moved their claim
            self.claims[copy.key] = replace(claim, expires_lo=lo, expires_hi=hi)

    def _first(self, copy: Copy, stream: Stream, e_lo: int, e_hi: int) -> None:
        e = copy.first_seen if copy.first_seen is not None else e_lo
        if not e_lo <= e <= e_hi:
            self.fail(
                f"{copy.key}: {copy.where} was decided at {e}, outside its bounds [{e_lo}, {e_hi}] (rule 1)"
            )
        least = max(e, stream.lo) + copy.ttl
        most = max(e, stream.hi) + copy.ttl
        expires = copy.expires_at
        if expires is not None and least <= expires <= most:
            least = most = expires
        else:
            self.fail(
                f"{copy.key}: {copy.where} claimed until {expires}, not one TTL ({copy.ttl} ms) from "
                f"max(its time {e}, stream time in [{stream.lo}, {stream.hi}]): [{least}, {most}] (rule 3)"
            )
        self.claims[copy.key] = Claim(least, most, e, copy.where, copy.variant)
        self.firsts[copy.key] = self.firsts.get(copy.key, 0) + 1
        stream.lo, stream.hi = max(stream.lo, e), max(stream.hi, e)

    def _body(self, copy: Copy, claim: Claim | None) -> None:
        """Rule 6: a copy that is not first is a conflict exactly when its body is not the claim's."""
        if not self.bodies or claim is None or claim.variant is None or copy.variant is None:
            return
        wanted = "conflict" if copy.variant != claim.variant else "duplicate"
        if copy.outcome != wanted:
            self.fail(
                f"{copy.key}: {copy.where} was {copy.outcome}, but its body is "
                f"{'not ' if wanted == 'conflict' else ''}the body of {claim.where}, which claimed the key: "
                f"it is a {wanted} (rule 6)"
            )

    def _wrong(self, copy: Copy, stream: Stream, claim: Claim | None, e_lo: int, e_hi: int) -> None:
        time = f"time {e_lo}" if e_lo == e_hi else f"time in [{e_lo}, {e_hi}]"
        if claim is None:
            self.fail(
                f"{copy.key}: {copy.where} ({time}) was {copy.outcome}, but no copy claimed the key before it"
            )
            return
        if copy.outcome == FIRST:
            self.fail(
                f"{copy.key}: {copy.where} ({time}) was first inside the window of the claim {claim.where} made "
                f"(until {claim.expires_at}; stream time at most {stream.hi}, the claim's bucket kept until "
                f"{self.kept_until(claim)}): a second command for one window"
            )
            return
        self.fail(
            f"{copy.key}: {copy.where} ({time}) was {copy.outcome}, but the claim {claim.where} made had expired "
            f"(at {claim.expires_at}): a copy after its window gave no command"
        )

    def kept_until(self, claim: Claim) -> int:
        """Rule 4: the stream time before which the claim's bucket is certainly still in the store."""
        return (claim.expires_lo // self.width + 2) * self.width

    def fail(self, problem: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(problem)
