"""A consumed batch: parsed per record, kept per partition (what to store, what to dead-letter)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message

from bridge.dialects import parse_record
from bridge.kafka import headers_of
from bridge.message import Cancel, Rejected, Rules, Scheduled
from bridge.store import Shard

logger = logging.getLogger(__name__)

STAMPED_AHEAD_TOLD_S = 60.0  # records stamped ahead are said once a minute at most


def coords(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed message, which always has all three."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def shard_of(msg: Message) -> Shard:
    """The delay-topic partition a consumed message came from."""
    topic, partition, _ = coords(msg)
    return Shard(topic, partition)


def shards_of(messages: Sequence[Message]) -> frozenset[Shard]:
    """The delay-topic partitions consumed messages came from (a Shard made per partition,
    not per message: this runs on every batch)."""
    pairs = {(m.topic(), m.partition()) for m in messages}
    return frozenset(Shard(t, p) for t, p in pairs if t is not None and p is not None)


@dataclass
class Batch:
    """What was read of each partition: the highest offset and the records to store (accepted
    ones and cancels), the lowest offset and the newest record timestamp; and the records
    rejected. Kept per partition, so a batch's bookkeeping is not per record."""

    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = field(default_factory=dict)
    rejected: list[tuple[Message, Rejected]] = field(default_factory=list)
    low: dict[Shard, int] = field(default_factory=dict)
    newest_ms: dict[Shard, int] = field(default_factory=dict)

    def merge(self, later: Batch) -> None:
        """Add a batch consumed after this one (offsets only grow within a partition)."""
        for shard, (high, records) in later.stored.items():
            mine = self.stored.get(shard)
            if mine is None:
                self.stored[shard] = (high, records)
            else:  # extended in place: a hold merges a linger's worth at a time
                mine[1].extend(records)
                self.stored[shard] = (max(mine[0], high), mine[1])
        for shard, low in later.low.items():
            self.low[shard] = min(low, self.low.get(shard, low))
        for shard, ts in later.newest_ms.items():
            self.newest_ms[shard] = max(ts, self.newest_ms.get(shard, ts))
        self.rejected += later.rejected

    def urgent(self, soon_ms: int) -> bool:
        """Whether to store it now rather than hold it for more (see ``Ingress._hold``): it has a
        dead letter, a cancel, a record due by ``soon_ms``, or one with its own delay-id (either
        may withdraw a record due soon)."""
        if self.rejected:
            return True
        for shard, (_, records) in self.stored.items():
            for rec in records:
                if not isinstance(rec, Scheduled) or rec.due_ms <= soon_ms:
                    return True
                if rec.given_id(shard.topic, shard.partition) is not None:
                    return True
        return False

    def stop_at(self, shard: Shard, offset: int, watermark: int) -> None:
        """Keep only what was read of ``shard`` before ``offset`` (its partition is held there):
        the records to store, and the watermark just below it (nothing, when that leaves no
        record and the ``watermark`` stored is that far already). How far its records were read
        is forgotten, so the shard counts as behind (bridge.catchup)."""
        _, records = self.stored.get(shard, (offset - 1, []))
        kept = [r for r in records if r.offset < offset]
        if kept or offset - 1 > watermark:
            self.stored[shard] = (offset - 1, kept)
        else:
            self.stored.pop(shard, None)
        self.newest_ms.pop(shard, None)

    def drop(self, shards: set[Shard]) -> None:
        """Leave out what was read of ``shards`` (read again, or by their next owner)."""
        for shard in shards:
            self.stored.pop(shard, None)
            self.low.pop(shard, None)
            self.newest_ms.pop(shard, None)
        self.rejected = [(m, r) for m, r in self.rejected if shard_of(m) not in shards]


def parse_batch(
    messages: list[Message], rules: Rules, now_ms: int, stamps_until_ms: int | None = None
) -> Batch:
    """Parse a consumed batch. Per record only what the record needs: the per-partition
    figures are kept in locals while the partition stays the same (consumed batches come in
    runs of one partition) and written to the batch when it changes. ``newest_ms`` takes no
    record stamped after ``stamps_until_ms`` (``now_ms`` if not given): the decision time as it
    was read. A producer whose clock is ahead stamps records later than they were produced,
    and such a stamp says nothing of what was produced before the record (bridge.catchup)."""
    batch = Batch()
    shard: Shard | None = None
    records: list[Scheduled | Cancel] = []
    high = low = 0
    newest = -1  # of the stamps trusted (-1: none yet)
    trusted = now_ms if stamps_until_ms is None else stamps_until_ms
    ahead = 0  # how far the stamps not trusted were ahead, at most

    def keep() -> None:
        if shard is None:
            return
        mine = batch.stored.get(shard)
        batch.stored[shard] = (high, records) if mine is None else (max(mine[0], high), records)
        batch.low[shard] = min(low, batch.low.get(shard, low))
        if newest >= 0:
            batch.newest_ms[shard] = max(newest, batch.newest_ms.get(shard, newest))

    for msg in messages:
        topic, partition, offset = coords(msg)
        ts_type, ts = msg.timestamp()
        if ts_type == 0:  # no timestamp: the moment it was read stands in
            ts = now_ms
        if shard is None or partition != shard.partition or topic != shard.topic:
            keep()
            shard = Shard(topic, partition)
            known = batch.stored.get(shard)
            records = [] if known is None else known[1]
            high = low = offset
            newest = -1
        if offset > high:
            high = offset
        elif offset < low:
            low = offset
        if ts > trusted:
            ahead = max(ahead, ts - trusted)
        elif ts > newest:
            newest = ts
        try:
            parsed = parse_record(
                rules,
                topic=topic,
                partition=partition,
                offset=offset,
                timestamp_ms=ts if ts_type != 0 else None,
                key=msg.key(),
                value=msg.value(),
                headers=headers_of(msg),
                now_ms=now_ms,
            )
        except Rejected as rejection:  # a parser bug too (see parse_record)
            batch.rejected.append((msg, rejection))
            continue
        if isinstance(parsed, Cancel) and parsed.more:  # one per id, all at its offset
            records.extend(parsed.each())
        else:
            records.append(parsed)
    keep()
    if ahead and trusted >= 0:  # -1: no stamp is trusted yet (bridge.egress.plan)
        _stamped_ahead(ahead)
    return batch


_told_ahead = [-math.inf]  # when records stamped ahead were last said (monotonic s)


def _stamped_ahead(ahead_ms: int) -> None:
    """Say, once a minute at most, that records were stamped ahead of the decision time."""
    now = time.monotonic()
    if now - _told_ahead[0] >= STAMPED_AHEAD_TOLD_S:
        _told_ahead[0] = now
        logger.warning(
            "records stamped up to %.1f s after this bridge's decision time were read (a "
            "producer's clock ahead?): their stamps are not taken as how far their partition "
            "is read, so its records with their own delay-id may wait longer for a re-read",
            ahead_ms / 1000,
        )
