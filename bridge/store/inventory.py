"""What the shards hold, read and never written.

Waiting records in due order whatever their priority (for the operator commands) and Redis memory
by tier (for the gauges).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import cast

import redis

from bridge.store.keys import LANE_BASES, LANE_WIDTH, Keys, Shard, due_of
from bridge.store.redis_errors import as_store_error


class Inventory:
    """Reads of the shards' keys that need no script."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def page(
        self, shard: Shard, due_before_ms: int | None = None, limit: int = 20
    ) -> list[tuple[int, bytes]]:
        """The ``limit`` earliest records waiting in ``shard`` (due before ``due_before_ms`` if
        given), whatever their priority: (due ms, member) in due order."""
        last = LANE_WIDTH - 1 if due_before_ms is None else due_before_ms - 1
        return heapq.nsmallest(limit, self._lanes(shard, lambda base: (base, base + last, limit)))

    def at(self, shard: Shard, due_ms: int, offset: bytes) -> list[tuple[int, bytes]]:
        """The record at ``offset`` (8 bytes) if it waits in ``shard`` due at ``due_ms``, in
        whichever lane: [(due ms, member)] or []."""
        found = self._lanes(shard, lambda base: (base + due_ms, base + due_ms, None))
        return [(due, m) for due, m in found if m.startswith(offset)]

    def _lanes(
        self, shard: Shard, bounds: Callable[[int], tuple[int, int, int | None]]
    ) -> list[tuple[int, bytes]]:
        """(due ms, member) of the records of each priority lane scored within ``bounds(base)``
        (lowest, highest, at most how many)."""
        due_index = self.keys.of(shard).due
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for base in LANE_BASES.values():
                low, high, limit = bounds(base)
                pipe.zrangebyscore(due_index, low, high, start=None if limit is None else 0,
                                   num=limit, withscores=True)  # fmt: skip
            pages = cast(list[list[tuple[bytes, float]]], pipe.execute())
        return [(due_of(s), m) for page in pages for m, s in page]

    def first(self, shard: Shard) -> int | None:
        """The earliest due time of a record waiting in ``shard`` (None: none waits)."""
        first = self.page(shard, None, 1)
        return first[0][0] if first else None

    def stored_bytes(self, shards: Sequence[Shard]) -> dict[str, int]:
        """Redis memory of the shards' records by tier — ``full`` (waiting or in flight, whole)
        and ``reference`` — as MEMORY USAGE estimates it from 5 samples per key."""
        tiers = {"full": 0, "reference": 0}
        if not shards:
            return tiers
        named = []
        for shard in shards:
            k = self.keys.of(shard)
            named += [("full", k.due), ("full", k.claimed), ("reference", k.refs),
                      ("reference", k.refs_due)]  # fmt: skip
        with as_store_error():
            pipe = self.client.pipeline(transaction=False)
            for _, key in named:
                pipe.memory_usage(key, samples=5)
            sizes = pipe.execute()
        for (tier, _), size in zip(named, sizes, strict=True):
            tiers[tier] += int(size or 0)
        return tiers
