"""Catching up: the shards whose delay-topic partition the ingress is reading behind its end.

A cancel or a replacement must be applied before the record it withdraws can be claimed. While
the ingress reads a partition live that holds by itself (a cancel produced before a record's
due time is read before it), but when it reads one again from an earlier offset — a new replica
after a crash or rebalance, a Redis rebuilt from the committed offsets, a topic read from its
beginning — the records read first may already be due while the cancels that withdraw them are
still further on in the log. So until the ingress reaches the partition's end as it was when
reading started, the mover claims from that shard only records due at or before the newest
record timestamp read so far (the *horizon*): nothing produced before a record fell due is
left unread when it is claimed. Records due later wait for the ingress, not the other way
round, and a partition read at its end costs nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container, Iterable

from bridge.store import Claimed, Shard

logger = logging.getLogger(__name__)


class CatchUp:
    """Shards being read behind their end offset, and how far they are read (thread-safe:
    the ingress writes, the mover reads)."""

    def __init__(self) -> None:
        self._ends: dict[Shard, int] = {}
        self._horizons: dict[Shard, int] = {}
        self._lock = threading.Lock()

    def start(self, shard: Shard, position: int, end: int) -> None:
        """The ingress reads ``shard`` from offset ``position`` and the partition ends at
        ``end`` (its high watermark): hold its records until it gets there."""
        if end <= position:
            self.stop(shard)
            return
        with self._lock:
            self._ends[shard] = end
            self._horizons[shard] = 0
        logger.info("catching up on %s[%d] up to offset %d: records are claimed only once the "
                    "records produced before they fell due are read", shard.topic,
                    shard.partition, end)  # fmt: skip

    def read(self, shard: Shard, timestamp_ms: int) -> None:
        """The ingress applied records of ``shard`` up to one with ``timestamp_ms``."""
        with self._lock:
            if shard in self._horizons:
                self._horizons[shard] = max(self._horizons[shard], timestamp_ms)

    def reached(self, shard: Shard, position: int) -> None:
        """The ingress's next offset to read in ``shard`` is ``position``."""
        with self._lock:
            end = self._ends.get(shard)
            if end is None or position < end:
                return
            del self._ends[shard], self._horizons[shard]
        logger.info("caught up on %s[%d]", shard.topic, shard.partition)

    def stop(self, shard: Shard) -> None:
        """``shard`` is no longer read here (revoked)."""
        with self._lock:
            self._ends.pop(shard, None)
            self._horizons.pop(shard, None)

    def ends(self) -> dict[Shard, int]:
        """The shards being caught up on, with the offset each must reach."""
        with self._lock:
            return dict(self._ends)

    def horizons(self) -> dict[Shard, int]:
        """Shard -> the due time up to which its records may be claimed, for shards behind."""
        with self._lock:
            return dict(self._horizons)

    def past(self, claims: Iterable[Claimed], in_flight: Container[tuple[Shard, bytes]]
             ) -> list[Claimed]:  # fmt: skip
        """The records of ``claims`` due past the horizon of their shard: a catch-up began after
        the mover read the horizons and before Redis ran its claim (the ingress re-reads after
        Redis lost its state, or a partition is assigned), so a cancel of theirs may still be
        unread; they are put back until the horizon passes them. A lease that ran out, or a
        record still ``in_flight``, is not: it was claimed before, and is past cancel."""
        horizons = self.horizons()
        past = [c for c in claims
                if c.shard in horizons and c.record.due_ms > horizons[c.shard]
                and not c.redelivery and (c.shard, c.member) not in in_flight]  # fmt: skip
        if past:
            logger.info("%d records claimed as a catch-up began wait for it", len(past))
        return past
