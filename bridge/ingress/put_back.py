"""What a rollback of Redis put back is forgotten there before its partition's claims resume.

When Redis loses its latest writes (a failover, an AOF tail), the acknowledgements among them
are lost too, and the records they removed are back, waiting or in flight. A partition read
again (bridge.ingress.settled) has the journal's entries read from where its re-read starts, or
from the last write Redis kept of it if that is earlier; those of records Redis may hold — before
the start, or up to its watermark — are forgotten there (settle.lua) before the partition's
claims resume. A partition whose forget Redis refuses (it is loading its data set after the
restart that lost the writes, say) claims no record until Redis answers and the forget is done
(bridge.catchup holds it): before, the records put back were delivered again the moment Redis
answered (the adversary with lanes, seed 6). So does a partition whose resume point Redis did
not give at its assignment: it may hold any of the partition's records, put back or not, and
once it answers what the journal holds is forgotten as at an assignment it answered.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping

from bridge.errors import BridgeError, StoreError
from bridge.journal import CLOCK_SLACK_MS, Entry, JournalReader
from bridge.metrics import Metrics
from bridge.store import ResumePoint, Shard, Store, shard_names

logger = logging.getLogger(__name__)

RETRY_S = 0.5  # how often a forget Redis refused is tried again


@dataclasses.dataclass(frozen=True)
class Unsettled:
    """A partition read again from ``start`` (``at_end``: nothing to read again) whose records
    the journal settled are not forgotten in Redis yet: ``entries``, or None while Redis's resume
    point is to be read first; ``leased``: records in flight are forgotten too."""

    start: int
    at_end: bool
    entries: list[Entry] | None
    leased: bool


class PutBack:
    """Forgets in Redis what a rollback put back, holding a partition's claims until it has."""

    def __init__(
        self,
        store: Store | None,
        reader: Callable[[], JournalReader] | None,
        topic_ids: Callable[[], Mapping[str, str]],
        metrics: Metrics | None,
        hold: Callable[[Shard, bool], None],
        strict: bool = False,
    ) -> None:
        self._store = store
        self._reader = reader  # None: no journal
        self._topic_ids = topic_ids
        self._metrics = metrics  # counts what it forgets (delay_bridge_redeliveries_avoided)
        self._hold = hold  # holds or releases a shard's claims (CatchUp.hold)
        # Exactly once: a journal that cannot be read holds the re-read up (see fates).
        self.strict = strict
        self._unsettled: dict[Shard, Unsettled] = {}
        self._next_try = 0.0

    def fates(
        self,
        reader: JournalReader,
        shard: Shard,
        start: int,
        point: ResumePoint | None,
        at_end: bool,
        ids: Mapping[str, str],
    ) -> list[Entry] | None:
        """The journal's entries for a re-read of ``shard`` from ``start`` (``point``: Redis's
        resume point of it, at an assignment), or None: nothing to read again and nothing Redis
        put back to look for, or the journal unreadable (said). Unreadable and :attr:`strict`,
        the BridgeError is raised: the caller waits for the journal."""
        since = self._since(shard, point.written if point else None)
        if at_end and since is None:
            return None
        try:
            return reader.fates(
                shard, start, ids.get(shard.topic, ""), since_ms=since, at_end=at_end
            )
        except BridgeError as exc:
            if self.strict:
                raise  # the caller says it once (bridge.ingress.journal_waits)
            logger.warning(
                "journal not read for the re-read of %s[%d] from offset %d (%s): "
                "records delivered since are delivered again",
                shard.topic,
                shard.partition,
                start,
                exc,
            )
            return None

    def forget(self, shard: Shard, held: Unsettled) -> None:
        """Forget ``held``'s entries in Redis, or hold ``shard``'s claims until that is done. One
        still to look at once Redis gives its resume point (:meth:`after_redis`) stays so: that
        look finds these entries too."""
        assert held.entries is not None
        if not self._settle(shard, held.entries, held.leased):
            waiting = self._unsettled.get(shard)
            if waiting is None or waiting.entries is not None:
                self._unsettled[shard] = held
            self._hold(shard, True)

    def after_redis(
        self, shards: Collection[Shard], starts: Mapping[Shard, int], ends: Mapping[Shard, int]
    ) -> None:
        """Redis did not give these shards' resume points at their assignment (read again from
        ``starts`` up to ``ends``): hold their claims until it answers and what it put back is
        forgotten."""
        if not shards:
            return
        logger.warning(
            "%s: no record is claimed until Redis answers and the records the journal holds "
            "as settled are forgotten there (a rollback may have put them back)",
            shard_names(shards),
        )
        for shard in sorted(shards):
            start = starts[shard]
            self._unsettled[shard] = Unsettled(
                start, start >= ends.get(shard, start + 1), None, False
            )
            self._hold(shard, True)

    def retry(self) -> None:
        """Forget what the shards held could not, at most once a RETRY_S; release each one's
        claims once done. One whose resume point Redis did not give is looked at now, as at an
        assignment: what the journal holds before where its re-read starts, or up to Redis's
        watermark if that is further."""
        if not self._unsettled or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + RETRY_S
        reader: JournalReader | None = None
        released: set[Shard] = set()
        try:
            for shard, held in list(self._unsettled.items()):
                entries = held.entries
                if entries is None:
                    assert self._store is not None and self._reader is not None
                    try:
                        point = self._store.inventory.resume_points([shard]).get(shard)
                    except StoreError:
                        continue
                    entries = []
                    if point is not None:  # Redis holds the shard: what did it put back?
                        reader = reader or self._reader()
                        ids = self._topic_ids()
                        try:
                            found = self.fates(reader, shard, held.start, point, held.at_end, ids)
                        except BridgeError:
                            continue
                        entries = before(found or [], held.start, point)
                    self._unsettled[shard] = dataclasses.replace(held, entries=entries)
                if self._settle(shard, entries, held.leased):
                    del self._unsettled[shard]
                    self._hold(shard, False)
                    released.add(shard)
        finally:
            if reader is not None:
                reader.close()
            if released:
                logger.info("%s: records are claimed again", shard_names(released))

    def let_go(self, shards: set[Shard]) -> None:
        """These partitions are no longer read here."""
        for shard in shards & set(self._unsettled):
            del self._unsettled[shard]
            self._hold(shard, False)

    def _since(self, shard: Shard, written: int | None) -> int | None:
        """From when the journal holds the fates of records a rollback may have put back among
        ``shard``'s waiting ones, or None: from the last write Redis kept of it (``written``),
        but only if a record due waits there, and not before the oldest such record's due time
        (never delivered, so never journaled, before it). A record due later waits as it
        should: never delivered, nothing put it back."""
        if written is None or self._store is None:
            return written
        try:  # due by this host's clock, or a peer's up to the slack ahead of it
            backlog = self._store.backlog([shard], now_ms=int(time.time() * 1000) + CLOCK_SLACK_MS)
        except StoreError:
            return written
        oldest = backlog.oldest_due_ms
        return None if oldest is None else max(written, oldest)

    def _settle(self, shard: Shard, entries: list[Entry], leased: bool) -> bool:
        """Forget in Redis the records a rollback put back after their fate was journaled (their
        acknowledgement was among the writes lost): they would be delivered again. ``leased``:
        those in flight too. Returns False when Redis failed."""
        if self._store is None or not entries:
            return True
        try:
            forgotten = self._store.settle(
                shard, [(e.offset, e.due_ms, e.delay_id) for e in entries], leased=leased
            )
        except StoreError as exc:
            logger.warning(
                "%s[%d]: records the journal holds as settled not forgotten in Redis yet (%s)",
                shard.topic,
                shard.partition,
                exc,
            )
            return False
        if self._metrics is not None:
            self._metrics.avoided(shard, "redis-lost-writes", forgotten)
        if forgotten:
            logger.warning(
                "%s[%d]: %d records Redis put back after their fate was journaled (their "
                "acknowledgements were among the writes it lost) are forgotten, not delivered "
                "again",
                shard.topic,
                shard.partition,
                forgotten,
            )
        return True


def before(entries: list[Entry], start: int, point: ResumePoint | None) -> list[Entry]:
    """Of the journal's ``entries`` for a re-read from ``start``, those of records Redis may hold
    (put back, not read again): before the start, or up to Redis's watermark (``point``)."""
    below = max(start, point.mark + 1) if point else start
    return [e for e in entries if e.offset < below]
