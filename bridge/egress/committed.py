"""What this replica committed lately, for exactly-once delivery to recognise a claim of it again.

A Redis that fails over (or restarts) can lose acknowledgements without its ingest watermark
going back, so no rebuild consults the journal: a record committed here comes back leased (claimed
again once its lease ran out) or waiting, its acknowledgement lost. The mover would deliver it a
second time. So each shard's committed offsets are kept for two leases and a minute at least
(how far behind a replica may be that lost acknowledgements and no ingested record), and a claim
that returns one of them settles it in Redis instead of producing it. Older ones come back leased,
the lease long run out: a record claimed again after its lease, and not in flight here, is looked
up in the journal first.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Container, Iterable

from bridge.errors import BridgeError, StoreError
from bridge.journal import Reconcile
from bridge.metrics import Metrics
from bridge.store import Claimed, Shard, Store, offset_of

logger = logging.getLogger(__name__)

# At most this many offsets are kept (the oldest go first): 120,000 at 2,000 records/s, ~10 MB.
MAX_KEPT = 1_000_000


class Committed:
    """Offsets committed lately, by shard: added on the shards' transaction threads, looked up
    on the mover's."""

    def __init__(
        self,
        store: Store,
        keep_s: float,
        journal: Reconcile | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics  # counts what it forgets (delay_bridge_redeliveries_avoided)
        self.keep_s = keep_s
        self.journal = journal  # asked about records claimed again after their lease ran out
        # By shard and epoch (Claimed.epoch): a new incarnation of the topic (the state retired)
        # has its records at the offsets of the old one's, committed here a moment ago.
        self._offsets: dict[tuple[Shard, str], set[int]] = {}
        # Each call's offsets by state, oldest first: a tuple of ints a transaction, which the
        # cycle collector does not follow — not an object per record (kept for minutes, they
        # filled its young generation every 15-30 s at 3,000 records/s, and each collection
        # held the interpreter 20-75 ms).
        self._order: deque[tuple[float, tuple[Shard, str], tuple[int, ...]]] = deque()
        self._count = 0  # the offsets in _order
        # Leases a take-over ended, the journal read and holding no fate: delivered, not looked up.
        self._reconciled: dict[Shard, set[int]] = {}
        self._lock = threading.Lock()

    def add(self, records: Iterable[Claimed]) -> None:
        """These records were committed now."""
        now = time.monotonic()
        by_state: dict[tuple[Shard, str], list[int]] = {}
        for c in records:
            state = (c.shard, c.epoch)
            offsets = by_state.get(state)
            if offsets is None:
                offsets = by_state[state] = []
            offsets.append(offset_of(c.member))
        with self._lock:
            for state, offsets in by_state.items():
                kept = self._offsets.get(state)
                if kept is None:
                    kept = self._offsets[state] = set()
                kept.update(offsets)
                self._order.append((now, state, tuple(offsets)))
                self._count += len(offsets)
            self._expire(now)

    def reconciled(self, offsets: dict[Shard, set[int]]) -> None:
        """A take-over read the journal for these offsets (leases it ends) and found no fate:
        their next claim is delivered without asking it again."""
        with self._lock:
            for shard, kept in offsets.items():
                self._reconciled[shard] = set(kept)

    def _expire(self, now: float) -> None:
        order = self._order
        while order and (order[0][0] < now - self.keep_s or self._count > MAX_KEPT):
            _, state, offsets = order.popleft()
            self._count -= len(offsets)
            kept = self._offsets.get(state)  # gone already if an offset was committed twice
            if kept is None:
                continue
            kept.difference_update(offsets)
            if not kept:
                del self._offsets[state]

    def again(
        self, claimed: Iterable[Claimed], in_flight: Container[tuple[Shard, bytes]]
    ) -> set[tuple[Shard, bytes]]:
        """The records among ``claimed`` not to be produced: those this replica committed lately,
        and those claimed again after their lease ran out (not in flight here) that the journal
        holds a fate for — both forgotten in Redis — or that it could not be asked about (leased:
        claimed again after the lease, and looked up again)."""
        found: dict[Shard, list[Claimed]] = {}
        expired: dict[Shard, list[Claimed]] = {}
        with self._lock:
            for c in claimed:
                kept = self._offsets.get((c.shard, c.epoch))
                if kept and offset_of(c.member) in kept:
                    found.setdefault(c.shard, []).append(c)
                elif c.redelivery and (c.shard, c.member) not in in_flight:
                    done = self._reconciled.get(c.shard)
                    if done and offset_of(c.member) in done:
                        done.discard(offset_of(c.member))
                    else:
                        expired.setdefault(c.shard, []).append(c)
        unsure: list[Claimed] = []
        for shard, records in expired.items() if self.journal is not None else ():
            assert self.journal is not None
            offsets = {offset_of(c.member): c for c in records}
            since = min(c.record.due_ms for c in records)  # never delivered before it was due
            try:
                fates = self.journal.journaled(shard, since, offsets)
            except BridgeError as exc:
                logger.warning(
                    "%s: journal not read for %d records claimed again after their lease (%s): "
                    "they wait for the next lease",
                    shard,
                    len(records),
                    exc,
                )
                unsure += records
                continue
            found.setdefault(shard, []).extend(offsets[o] for o in fates)
        for shard, records in found.items():
            settled = [(offset_of(c.member), c.record.due_ms, c.record.delay_id) for c in records]
            # If Redis fails, they stay leased: claimed again after the lease, found here again.
            with contextlib.suppress(StoreError):
                n = self.store.settle(shard, settled)
                if self.metrics is not None:
                    self.metrics.avoided(shard, "lease-expired", n)
        return {(c.shard, c.member) for c in (*unsure, *(c for r in found.values() for c in r))}
