"""What the shards hold, read and never written.

Waiting records in due order whatever their priority (for the operator commands), which offsets
are pending, the shards' watermarks and wait indexes, and Redis memory by tier (for the gauges).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple, cast

import redis

from bridge.message import MAX_INT32, parse_count
from bridge.store.calls import candidates_argv
from bridge.store.keys import (
    LANE_BASES,
    LANE_WIDTH,
    Keys,
    Shard,
    due_of,
    offset_bytes,
    offset_of,
    reference,
    references_in,
    text,
)
from bridge.store.redis_errors import as_store_error
from bridge.store.scripts import CANDIDATES, Scripts

ALL = 2**62  # a limit that is none
SCAN_COUNT = 1000  # members a ZSCAN call asks for
SCAN_CHUNKS = 4  # reference chunks an HMGET of a scan reads (up to 1,023 references each)


class ResumePoint(NamedTuple):
    """Where an owner of a shard goes on: its watermark, the offset to read from, whether an
    earlier owner was reading it again after Redis lost it, not yet up to where it ended (meta
    "reread", see add.lua), and when Redis last took a write of it (an add or an
    acknowledgement: meta "written", epoch ms; None: a state made before it was kept)."""

    mark: int
    start: int
    reread: bool = False
    written: int | None = None

    @classmethod
    def read(
        cls, fields: Sequence[bytes | None], lowest: Sequence[tuple[bytes, float]] = ()
    ) -> ResumePoint:
        """The shard's, from its meta's watermark and :data:`RESUME_FIELDS` (``fields``, the
        watermark set) and the lowest entry kept to look for in other partitions (its
        ``withdrawing`` ZSET's first, with its score; meta "withdrawing" is where earlier code
        kept them)."""
        raw_mark, left, reread, at = fields
        mark = int(raw_mark or -1)
        kept = [int(t.split(b":")[0]) for t in (left or b"").split()]
        kept += [int(score) for _, score in lowest]
        written = None if at is None else int(at)
        return cls(mark, min([mark + 1, *kept]), bool(reread), written)


RESUME_FIELDS = ["withdrawing", "reread", "written"]  # what a resume point reads of meta


class Inventory:
    """Reads of the shards' keys (one read-only script: the id index's candidates)."""

    def __init__(self, client: redis.Redis, keys: Keys, scripts: Scripts) -> None:
        self.client = client
        self.keys = keys
        self.scripts = scripts  # candidates.lua: the id index's buckets are addressed in Lua

    def page(
        self, shard: Shard, due_before_ms: int | None = None, limit: int = 20
    ) -> list[tuple[int, bytes]]:
        """The ``limit`` earliest records waiting in ``shard`` (due before ``due_before_ms`` if
        given), whatever their priority or tier: (due ms, member) in due order, a reference's
        member its 16 bytes (:func:`bridge.store.keys.reference`)."""
        last = LANE_WIDTH - 1 if due_before_ms is None else due_before_ms - 1
        whole = self._lanes(shard, lambda base: (base, base + last, limit))
        return heapq.nsmallest(limit, whole + self.references(shard, last, limit))

    def count(self, shard: Shard, due_before_ms: int | None = None) -> int:
        """How many records :meth:`page` could give: those waiting in ``shard`` (due before
        ``due_before_ms`` if given), references included — a ZCOUNT per index and lane, and the
        references' count (with a due bound, their chunks up to it are read)."""
        last = LANE_WIDTH - 1 if due_before_ms is None else due_before_ms - 1
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for key in self.waiting_keys(shard):
                for base in LANE_BASES.values():
                    pipe.zcount(key, base, base + last)
            whole = sum(cast(list[int], pipe.execute()))
            if due_before_ms is None:
                refs = int(
                    cast(bytes | None, self.client.hget(self.keys.of(shard).refs, "count")) or 0
                )
                return whole + refs
        return whole + len(self.references(shard, last, ALL))

    def references(self, shard: Shard, last_ms: int, limit: int) -> list[tuple[int, bytes]]:
        """At least the ``limit`` earliest references waiting in ``shard`` due by ``last_ms``
        (not cancelled: still pending), as (due ms, its 16 bytes); their chunks are read in
        bucket order until the next bucket starts after the ``limit``-th due time found."""
        k = self.keys.of(shard)
        found: list[tuple[int, bytes]] = []
        with as_store_error():
            chunks = cast(
                list[tuple[bytes, float]],
                self.client.zrangebyscore(k.refs_due, "-inf", last_ms, withscores=True),
            )
            for field, start in chunks:
                if len(found) >= limit and heapq.nsmallest(limit, found)[-1][0] < start:
                    break
                data = cast(bytes | None, self.client.hget(k.refs, text(field)))
                refs = [(o, d) for o, d in references_in(data or b"") if d <= last_ms]
                pending = self._pending_of([o for o, _ in refs], k.pending)
                found += [(d, reference(o, d)) for o, d in refs if o in pending]
        return found

    def scan(
        self, shard: Shard, low_ms: int | None, high_ms: int | None
    ) -> Iterator[list[tuple[int, bytes]]]:
        """Every record waiting in ``shard`` due at ``low_ms`` or later and before ``high_ms``
        (None: no bound), in pages of (due ms, member), in no order: those held whole by ZSCAN
        of its due index and wait indexes (one present throughout is given at least once, maybe
        twice: Redis's SCAN promise), then its references, a few chunks at a time, if still
        pending. A bulk operation's reads: O(what the shard holds)."""
        low, high = -1 if low_ms is None else low_ms, LANE_WIDTH if high_ms is None else high_ms
        for key in self.waiting_keys(shard):
            cursor = 0
            while True:
                with as_store_error():
                    cursor, page = cast(
                        tuple[int, list[tuple[bytes, float]]],
                        self.client.zscan(key, cursor, count=SCAN_COUNT),
                    )
                found = [(due, m) for m, s in page if low <= (due := due_of(s)) < high]
                if found:
                    yield found
                if cursor == 0:
                    break
        k = self.keys.of(shard)
        with as_store_error():
            chunks = cast(list[bytes], self.client.zrangebyscore(k.refs_due, "-inf", high - 1))
        for at in range(0, len(chunks), SCAN_CHUNKS):
            with as_store_error():
                read = self.client.hmget(k.refs, chunks[at : at + SCAN_CHUNKS])
                data = b"".join(d or b"" for d in cast(list[bytes | None], read))
                refs = [r for r in references_in(data) if low <= r[1] < high]
                pending = self._pending_of([o for o, _ in refs], k.pending)
            found = [(d, reference(o, d)) for o, d in refs if o in pending]
            if found:
                yield found

    def _pending_of(self, offsets: Sequence[int], pending_key: str) -> set[int]:
        """Which of ``offsets`` are pending, their bitmaps read in one call."""
        buckets = sorted({offset_bytes(o)[:7] for o in offsets})
        if not buckets:
            return set()
        maps = dict(
            zip(
                buckets,
                cast(list[bytes | None], self.client.hmget(pending_key, buckets)),
                strict=True,
            )
        )
        out = set()
        for o in offsets:
            key = offset_bytes(o)
            bitmap = maps[key[:7]]
            if bitmap is not None and bitmap[key[7] // 8] & 1 << key[7] % 8:
                out.add(o)
        return out

    def at(self, shard: Shard, due_ms: int, offset: bytes) -> list[tuple[int, bytes]]:
        """The record at ``offset`` (8 bytes) if it waits in ``shard`` due at ``due_ms``, in
        whichever lane: [(due ms, member)] or []."""
        found = self._lanes(shard, lambda base: (base + due_ms, base + due_ms, None))
        return [(due, m) for due, m in found if m.startswith(offset)]

    def by_id(self, shard: Shard, delay_id: str) -> list[tuple[int, bytes]]:
        """The waiting records of ``shard`` the id index gives as candidates for the caller-given
        ``delay_id``: [(due ms, member)], a reference as its 16 bytes. The index keeps a hash of
        the id, so the caller confirms each by the delay-id of the record (a reference's read in
        the delay topic); a default id is not in the index (bridge.lookup.by_default_id)."""
        k = self.keys.of(shard)
        call = (CANDIDATES.keys(k), candidates_argv(shard.topic, [delay_id]))
        [reply] = self.scripts.call(CANDIDATES, [call])
        [candidates] = reply.found
        found: list[tuple[int, bytes]] = []
        for offset, due in candidates:
            at = offset_bytes(offset)
            found += self.at(shard, due, at) or self.reference_at(shard, at, due)
        return found

    def promotions(self, shard: Shard) -> int:
        """How many times the read-back promoted references of ``shard`` (see add.lua, ARGV[4])."""
        with as_store_error():
            return int(
                cast(bytes | None, self.client.hget(self.keys.of(shard).refs, "promoted")) or 0
            )

    def wholes(self, shard: Shard, offsets: Collection[int]) -> dict[int, int]:
        """Where the records at these ``offsets`` of ``shard`` wait held whole: offset -> due ms,
        or -1 where none does (a reference, or gone). One pass over the shard's whole records
        for all of them: for what a due time does not find (add.lua checks a cancel's hint)."""
        rest = {offset_bytes(o): o for o in offsets}
        found: dict[int, int] = {}
        for key in self.waiting_keys(shard) if rest else []:
            with as_store_error():
                for m, s in self.client.zscan_iter(key, count=SCAN_COUNT, score_cast_func=float):
                    if (named := rest.get(m[:8])) is not None:
                        found[named] = due_of(s)
        return {o: found.get(o, -1) for o in offsets}

    def reference_at(self, shard: Shard, offset: bytes, due_ms: int) -> list[tuple[int, bytes]]:
        """The record at ``offset``, waiting in no index, as a reference if it is one (pending,
        not in flight): [(due ms, its 16 bytes)] or []."""
        number = offset_of(offset)
        with as_store_error():
            in_flight = self.client.zscore(self.keys.of(shard).inflight, offset) is not None
        if in_flight or not self.is_pending(shard, number):
            return []
        return [(due_ms, reference(number, due_ms))]

    def _lanes(
        self, shard: Shard, bounds: Callable[[int], tuple[int, int, int | None]]
    ) -> list[tuple[int, bytes]]:
        """(due ms, member) of the records of each priority lane scored within ``bounds(base)``
        (lowest, highest, at most how many), in the due index and the wait indexes."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for key in self.waiting_keys(shard):
                for base in LANE_BASES.values():
                    low, high, limit = bounds(base)
                    pipe.zrangebyscore(
                        key,
                        low,
                        high,
                        start=None if limit is None else 0,
                        num=limit,
                        withscores=True,
                    )
            pages = cast(list[list[tuple[bytes, float]]], pipe.execute())
        return [(due_of(s), m) for page in pages for m, s in page]

    def waiting_keys(self, shard: Shard) -> list[str]:
        """The keys of the records waiting in ``shard``: its due index, then the wait index of
        each rate-limited target that has records waiting for its rate (waiting_keys in
        _lib.lua)."""
        k = self.keys.of(shard)
        with as_store_error():
            targets = cast(set[bytes], self.client.smembers(k.waits))
        return [k.due, *(self.keys.wait(shard, text(t)) for t in sorted(targets))]

    def first(self, shard: Shard) -> int | None:
        """The earliest due time of a record waiting in ``shard`` (None: none waits)."""
        first = self.page(shard, None, 1)
        return first[0][0] if first else None

    def in_flight(self, shard: Shard, offset: int) -> bool:
        """Whether the record at ``offset`` is claimed and not yet acknowledged."""
        with as_store_error():
            return (
                self.client.zscore(self.keys.of(shard).inflight, offset_bytes(offset)) is not None
            )

    def leases(self, shard: Shard) -> dict[bytes, int]:
        """The records of ``shard`` in flight: each one's member (its offset's 8 bytes) and lease
        deadline (Redis ms)."""
        with as_store_error():
            leased = self.client.zrange(self.keys.of(shard).inflight, 0, -1, withscores=True)
        return {m: int(d) for m, d in cast(list[tuple[bytes, float]], leased)}

    def is_pending(self, shard: Shard, offset: int) -> bool:
        """Whether the record at ``offset`` is still held (due later, overdue or in flight)."""
        return offset in self.pending(shard, [offset])

    def pending(self, shard: Shard, offsets: Sequence[int]) -> set[int]:
        """Which of ``offsets`` of ``shard`` are still held, their bitmaps read in one call."""
        with as_store_error():
            return self._pending_of(offsets, self.keys.of(shard).pending)

    def watermarks(self, shards: Sequence[Shard]) -> dict[Shard, int]:
        """The ingest watermark of each shard that has one."""
        return {s: point.mark for s, point in self.resume_points(shards).items()}

    def rereading(self, shards: Sequence[Shard]) -> tuple[set[Shard], set[Shard]]:
        """Those of ``shards`` their owners read again after Redis lost them, not yet up to where
        they ended (meta "reread", see add.lua); and those Redis holds no state of (no
        watermark: lost, or never made)."""
        replies = _each_meta(self.client, self.keys, shards, "hmget", ["ingested", "reread"])
        pairs = list(zip(shards, replies, strict=True))
        return {s for s, (_, flag) in pairs if flag}, {s for s, (mark, _) in pairs if mark is None}

    def reread_over(self, shards: Sequence[Shard]) -> None:
        """These shards were applied up to where their re-read ended: not :meth:`rereading`."""
        _each_meta(self.client, self.keys, shards, "hdel", "reread")

    def resume_points(self, shards: Sequence[Shard]) -> dict[Shard, ResumePoint]:
        """For each shard that has a watermark, where to go on (:class:`ResumePoint`): the offset
        after the watermark, or the lowest cancel or replacement add.lua keeps (``withdrawing``)
        until it is looked for in the topic's other partitions, which the next add hands back."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for keys in map(self.keys.of, shards):
                pipe.hmget(keys.meta, ["ingested", *RESUME_FIELDS])
                pipe.zrange(keys.withdrawing, 0, 0, withscores=True)
            values = pipe.execute()
        points = zip(shards, values[0::2], values[1::2], strict=True)
        return {s: ResumePoint.read(f, low) for s, f, low in points if f[0] is not None}

    def stored_shards(self, topic: str) -> list[Shard]:
        """The live shards of ``topic`` that Redis holds state for, by partition: what the
        operator commands read when Kafka cannot say which partitions the topic has."""
        pattern = self.keys.meta_pattern(topic)
        with as_store_error():
            names = [text(k) for k in self.client.scan_iter(match=pattern, count=1000)]
        partitions = {p for p in (self.keys.partition_of(n, topic) for n in names) if p}
        numbers = (parse_count(p, MAX_INT32) for p in partitions)
        return [Shard(topic, p) for p in sorted(n for n in numbers if n is not None)]

    def waits(self, shards: Sequence[Shard]) -> dict[Shard, set[str]]:
        """The targets with records in each shard's wait indexes (shards with none left out)."""
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.smembers(self.keys.of(shard).waits)
            replies = pipe.execute()
        return {
            s: {text(t) for t in targets}
            for s, targets in zip(shards, replies, strict=True)
            if targets
        }

    def stored_bytes(self, shards: Sequence[Shard]) -> dict[str, int]:
        """Redis memory of the shards' records by tier — ``full`` (waiting or in flight, whole)
        and ``reference`` — as MEMORY USAGE estimates it from 5 samples per key."""
        tiers = {"full": 0, "reference": 0}
        if not shards:
            return tiers
        named = []
        waits = self.waits(shards)
        for shard in shards:
            k = self.keys.of(shard)
            named += [
                ("full", k.due),
                ("full", k.claimed),
                ("reference", k.refs),
                ("reference", k.refs_due),
            ]
            named += [("full", self.keys.wait(shard, t)) for t in waits.get(shard, ())]
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for _, key in named:
                pipe.memory_usage(key, samples=5)
            sizes = pipe.execute()
        for (tier, _), size in zip(named, sizes, strict=True):
            tiers[tier] += int(size or 0)
        return tiers


def _each_meta(
    client: redis.Redis, keys: Keys, shards: Sequence[Shard], command: str, field: str | list[str]
) -> list[Any]:
    """The replies of a HASH ``command`` on the meta ``field`` (or fields) of each shard,
    pipelined."""
    if not shards:
        return []
    with as_store_error():
        pipe = client.pipeline(transaction=False)
        for shard in shards:
            getattr(pipe, command)(keys.of(shard).meta, field)
        return list(pipe.execute())


def due_counts(inventory: Inventory, shard: Shard, bounds: Sequence[int]) -> list[int]:
    """How many records waiting in ``shard`` fall due in each span from one of ``bounds`` (epoch
    ms, ascending) up to the next: ``len(bounds) - 1`` counts, references included. A ZCOUNT per
    span, index and lane, in one pipeline; the references' chunks up to the last bound read once."""
    spans = list(itertools.pairwise(bounds))
    keys = inventory.waiting_keys(shard)
    with as_store_error():
        pipe = inventory.client.pipeline(transaction=False)
        for low, high in spans:
            for key in keys:
                for base in LANE_BASES.values():
                    pipe.zcount(key, base + low, f"({base + high}")
        counts = cast(list[int], pipe.execute())
    per = len(keys) * len(LANE_BASES)
    found = [sum(counts[i * per : (i + 1) * per]) for i in range(len(spans))]
    if spans:
        for due, _ in inventory.references(shard, bounds[-1] - 1, ALL):
            at = bisect.bisect_right(bounds, due) - 1
            if 0 <= at < len(spans):
                found[at] += 1
    return found
