"""What this replica committed lately, for exactly-once delivery to recognise a claim of it again.

A Redis that fails over (or restarts) can lose acknowledgements without its ingest watermark
going back, so no rebuild consults the journal: a record committed here comes back leased (claimed
again once its lease ran out) or waiting, its acknowledgement lost. The mover would deliver it a
second time. So each shard's committed offsets are kept for twice the lease (what a lost
acknowledgement can take to come back), and a claim that returns one of them settles it in Redis
instead of producing it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterable

from bridge.errors import StoreError
from bridge.store import Claimed, Shard, Store, offset_of

# At most this many offsets are kept (the oldest go first): about 8 MB at 2,000 records/s.
MAX_KEPT = 1_000_000


class Committed:
    """Offsets committed lately, by shard: added on the shards' transaction threads, looked up
    on the mover's."""

    def __init__(self, store: Store, keep_s: float) -> None:
        self.store = store
        self.keep_s = keep_s
        self._offsets: dict[Shard, set[int]] = {}
        self._order: deque[tuple[float, Shard, int]] = deque()  # oldest first
        self._lock = threading.Lock()

    def add(self, shard: Shard, members: Iterable[bytes]) -> None:
        """These records of ``shard`` were committed now."""
        now = time.monotonic()
        with self._lock:
            kept = self._offsets.setdefault(shard, set())
            for member in members:
                offset = offset_of(member)
                kept.add(offset)
                self._order.append((now, shard, offset))
            self._expire(now)

    def _expire(self, now: float) -> None:
        order = self._order
        while order and (order[0][0] < now - self.keep_s or len(order) > MAX_KEPT):
            _, shard, offset = order.popleft()
            self._offsets[shard].discard(offset)

    def again(self, claimed: Iterable[Claimed]) -> set[tuple[Shard, bytes]]:
        """The records among ``claimed`` this replica committed lately: forgotten in Redis (not
        to be produced); returns them. If Redis fails meanwhile they stay leased, and are
        looked up again when claimed again."""
        found: dict[Shard, list[Claimed]] = {}
        with self._lock:
            for c in claimed:
                kept = self._offsets.get(c.shard)
                if kept and offset_of(c.member) in kept:
                    found.setdefault(c.shard, []).append(c)
        for shard, records in found.items():
            settled = [(offset_of(c.member), c.record.due_ms, c.record.delay_id) for c in records]
            # If Redis fails, they stay leased: claimed again after the lease, found here again.
            with contextlib.suppress(StoreError):
                self.store.settle(shard, settled)
        return {(c.shard, c.member) for records in found.values() for c in records}
