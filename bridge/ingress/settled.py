"""What a re-read must not schedule again: records whose fate the journal holds.

When the ingress reads a partition again from below what Redis had stored — Redis lost its state
(wiped, or restarted empty), or writes (a failover, an AOF tail), or was wiped while the bridge
was stopped — the records it meets were stored before, and some were delivered, cancelled,
replaced or dead-lettered since. Redis, which knew, lost it; the journal did not. Before the
re-read starts, the journal's entries for the partition from there on are read (located by the
time of the first record re-read, :meth:`JournalReader.settled`), and those records are left
out of what is stored again. When Redis lost only its latest writes (a failover, an AOF tail:
its watermark went back), the acknowledgements among them are lost too, and the records they
removed are back, waiting or in flight: the journal's entries from there on name them, and they
are forgotten in Redis (settle.lua) before the partition's claims resume. What was delivered and
not yet journaled when Redis lost it is delivered again: at most the records in flight then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from bridge.errors import BridgeError, StoreError
from bridge.journal import Entry, JournalReader
from bridge.message import Cancel, Scheduled
from bridge.store import Shard, Store

logger = logging.getLogger(__name__)


class Settled:
    """The journal's settled offsets of the partitions read again, until the read passes them."""

    def __init__(
        self,
        reader: Callable[[], JournalReader] | None,
        store: Store | None = None,
        topic_ids: Callable[[], Mapping[str, str]] = dict,
        before_read: Callable[[set[Shard]], None] = lambda shards: None,
    ):
        self._reader = reader  # None: no journal
        self._store = store
        # What is in flight of the partitions commits first (Egress.before_rebuild).
        self._before_read = before_read
        # The delay topics' ids as last heard: entries of an earlier incarnation are not these.
        self._topic_ids = topic_ids
        self._offsets: dict[Shard, frozenset[int]] = {}
        self._last: dict[Shard, int] = {}

    def load(self, starts: Mapping[Shard, int], rolled_back: Collection[Shard] = ()) -> None:
        """These partitions are read again from these offsets: learn what of them is settled.
        Those ``rolled_back`` (Redis lost writes it had taken) also have what the journal holds
        of their records before the start forgotten in Redis, before their claims resume."""
        if self._reader is None or not starts:
            return
        self._before_read(set(starts))
        reader, ids = self._reader(), self._topic_ids()
        try:
            for shard, start in starts.items():
                try:
                    entries = reader.fates(shard, start, ids.get(shard.topic, ""))
                except BridgeError as exc:
                    logger.warning(
                        "journal not read for the re-read of %s[%d] from offset %d (%s): "
                        "records delivered since are delivered again",
                        shard.topic,
                        shard.partition,
                        start,
                        exc,
                    )
                    continue
                offsets = frozenset(e.offset for e in entries if e.offset >= start)
                if offsets:
                    self._offsets[shard], self._last[shard] = offsets, max(offsets)
                    logger.info(
                        "%s[%d] is read again from offset %d; the journal holds the fate of "
                        "%d records since, which are not scheduled again",
                        shard.topic,
                        shard.partition,
                        start,
                        len(offsets),
                    )
                if shard in rolled_back:
                    self._forget_put_back(shard, [e for e in entries if e.offset < start])
        finally:
            reader.close()

    def _forget_put_back(self, shard: Shard, entries: list[Entry]) -> None:
        """Forget in Redis the records a rollback put back after their fate was journaled (their
        acknowledgement was among the writes lost): they would be delivered again."""
        if self._store is None or not entries:
            return
        try:
            forgotten = self._store.settle(
                shard, [(e.offset, e.due_ms, e.delay_id) for e in entries]
            )
        except StoreError as exc:
            logger.warning(
                "%s[%d]: records the journal holds as settled not forgotten in Redis (%s): "
                "those Redis put back are delivered again",
                shard.topic,
                shard.partition,
                exc,
            )
            return
        if forgotten:
            logger.warning(
                "%s[%d]: %d records Redis put back after their fate was journaled (their "
                "acknowledgements were among the writes it lost) are forgotten, not delivered "
                "again",
                shard.topic,
                shard.partition,
                forgotten,
            )

    def drop(self, stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]]) -> int:
        """Leave out of ``stored`` (a batch's records by partition, with the highest offset
        read) the settled ones; returns how many."""
        dropped = 0
        for shard in [s for s in stored if s in self._offsets]:
            high, records = stored[shard]
            settled = self._offsets[shard]
            kept = [r for r in records if r.offset not in settled or isinstance(r, Cancel)]
            dropped += len(records) - len(kept)
            stored[shard] = (high, kept)
            if high >= self._last[shard]:
                del self._offsets[shard], self._last[shard]
        return dropped

    def forget(self, shards: set[Shard]) -> None:
        """These partitions are no longer read here."""
        for shard in shards & set(self._offsets):
            del self._offsets[shard], self._last[shard]
