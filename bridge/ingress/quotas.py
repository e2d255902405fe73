"""Per-target quotas: records past their target's quota go to the DLQ, not into Redis.

``limits.max_waiting_per_target`` says how many records a target may keep waiting; a record that
would take its target past that goes to the DLQ as quota-exceeded instead.

What a target keeps waiting is counted by the store's scripts, per shard, as records move in and
out of Redis (the targets HASH in _lib.lua), so the count survives restarts and needs no scan.
The ingress reads the counts of every partition of the delay topics at most REFRESH_S apart and
adds what it admitted since, and reads them again before it refuses a record by counts read
earlier: one replica never goes past a quota, nor refuses a record by a count Redis no longer
has; replicas admitting records for the same target in the same second may go past it, by what
they admit in it. A record read again (at or below its shard's watermark: applied before) is not
judged again. A cancel passes whatever the count, and so does a record with a caller-given
delay-id that the id index names as waiting — a replacement, which takes one record's place (by
a hash of the id: a record of another id whose hash is alike passes too, one in about a
trillion)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Message

from bridge.ingress.batch import Batch, coords
from bridge.message import Reason, Rejected, Scheduled
from bridge.store import Shard, Store

REFRESH_S = 1.0  # how old the counts read from Redis may be
KNOWN_TARGETS = 10_000  # targets whose quota is remembered, at most


class Quotas:
    """The quotas of ``limits`` (target regex -> records), applied to consumed batches."""

    def __init__(
        self,
        limits: Mapping[str, int],
        store: Store,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._patterns = [(pattern, re.compile(pattern), n) for pattern, n in limits.items()]
        self._of: dict[str, tuple[str, int] | None] = {}
        self.store = store
        self._clock = clock
        self._counts: Counter[str] = Counter()
        self._read_at: float | None = None

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def quota_of(self, target: str) -> tuple[str, int] | None:
        """The pattern that sets ``target``'s quota and the quota (None: it has none)."""
        if target not in self._of:
            if len(self._of) >= KNOWN_TARGETS:  # targets named by producers: kept bounded
                self._of.clear()
            self._of[target] = next(
                ((p, n) for p, rx, n in self._patterns if rx.fullmatch(target)), None
            )
        return self._of[target]

    def limit(self, target: str) -> int | None:
        """``target``'s quota (None: it has none)."""
        found = self.quota_of(target)
        return None if found is None else found[1]

    def waiting(self, partitions: Mapping[str, int], *, fresh: bool = False) -> Counter[str]:
        """Records held per target (waiting or in flight) over every partition of the delay
        topics, as Redis counted them at most REFRESH_S ago (``fresh``: now), plus what was
        admitted since."""
        now = self._clock()
        if fresh or self._read_at is None or now - self._read_at >= REFRESH_S:
            shards = [Shard(t, p) for t, n in sorted(partitions.items()) for p in range(n)]
            self._counts = self.store.targets.waiting_by_target(shards)
            self._read_at = now
        return self._counts

    def apply(
        self,
        batch: Batch,
        marks: Mapping[Shard, int],
        partitions: Mapping[str, int],
        find: Callable[[Shard, int], Message],
        settled: Callable[[Shard, int], bool] = lambda shard, offset: False,
    ) -> int:
        """Move the records of ``batch`` past their target's quota from what it stores to what it
        rejects (``find`` gives a record's consumed message by shard and offset); returns how
        many moved. Records at or below their shard's watermark in ``marks`` stay, and so do
        those a re-read leaves out (``settled``: the journal holds their fate) and those that
        carry a recurring schedule on (the schedule was counted when it came in)."""
        judged = [
            (shard, rec)
            for shard, (_, records) in batch.stored.items()
            for rec in records
            if isinstance(rec, Scheduled)
            and rec.continues
            is None  # carrying a schedule on: in the place of the one it continues
            and rec.offset > marks.get(shard, -1)
            and not settled(shard, rec.offset)
            and self.quota_of(rec.target) is not None
        ]
        if not judged:
            return 0
        read_at = self._read_at
        counts = self.waiting(partitions)
        over = _over(judged, counts, self.limit)
        if over and self._read_at == read_at:  # refused by counts read before: read them now
            counts = self.waiting(partitions, fresh=True)
            over = _over(judged, counts, self.limit)
        replacing = self._replacing(over, partitions)
        refused: dict[Shard, set[int]] = {}
        for shard, rec in over:
            if (shard.topic, rec.delay_id) in replacing:
                continue
            pattern, quota = self.quota_of(rec.target) or ("", 0)
            detail = (
                f"{rec.target!r} has {counts[rec.target]} records waiting; its quota is {quota} "
                f"(limits.max_waiting_per_target {pattern!r})"
            )
            rejection = Rejected(Reason.QUOTA_EXCEEDED, detail)
            batch.rejected.append((find(shard, rec.offset), rejection))
            refused.setdefault(shard, set()).add(rec.offset)
        for shard, offsets in refused.items():
            high, records = batch.stored[shard]
            batch.stored[shard] = (high, [r for r in records if r.offset not in offsets])
        return sum(len(o) for o in refused.values())

    def _replacing(
        self, over: Sequence[tuple[Shard, Scheduled]], partitions: Mapping[str, int]
    ) -> set[tuple[str, str]]:
        """(delay topic, delay-id) of the records of ``over`` that replace one waiting."""
        asked: dict[str, set[str]] = {}
        for shard, rec in over:
            if rec.given_id(shard.topic, shard.partition) is not None:
                asked.setdefault(shard.topic, set()).add(rec.delay_id)
        found: set[tuple[str, str]] = set()
        for topic, ids in asked.items():
            shards = [Shard(topic, p) for p in range(partitions.get(topic, 0))]
            found |= {(topic, i) for i in self.store.targets.ids_waiting(shards, sorted(ids))}
        return found


def _over(
    judged: Sequence[tuple[Shard, Scheduled]],
    counts: Counter[str],
    limit: Callable[[str], int | None],
) -> list[tuple[Shard, Scheduled]]:
    """The records of ``judged`` (in order) past their target's quota, counting in ``counts``
    each one admitted."""
    over = []
    for shard, rec in judged:
        if counts[rec.target] < (limit(rec.target) or 0):
            counts[rec.target] += 1
        else:
            over.append((shard, rec))
    return over


def message_finder(messages: Sequence[Message]) -> Callable[[Shard, int], Message]:
    """A record's consumed message by its shard and offset, from a batch's ``messages``."""
    by: dict[tuple[str, int, int], Message] = {}

    def find(shard: Shard, offset: int) -> Message:
        if not by:
            by.update((coords(m), m) for m in messages)
        return by[(shard.topic, shard.partition, offset)]

    return find
