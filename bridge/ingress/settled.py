"""What a re-read must not schedule again: records whose fate the journal holds.

When the ingress reads a partition again from below what Redis had stored — Redis lost its state
(wiped, or restarted empty), or writes (a failover, an AOF tail), or was wiped while the bridge
was stopped — the records it meets were stored before, and some were delivered, cancelled,
replaced or dead-lettered since. Redis, which knew, lost it; the journal did not. Before the
re-read starts, the journal's entries for the partition from there on are read (located by the
time of the first record re-read, :meth:`JournalReader.settled`), and those records are left
out of what is stored again. When Redis lost only its latest writes (a failover, an AOF tail),
the records whose acknowledgements were among them are back: the journal's entries name them,
and they are forgotten in Redis before the partition's claims resume (bridge.ingress.put_back)
— on every read again, as Redis's watermark need not have gone back past the group's commit
for it. What was delivered and not yet journaled when Redis lost it is delivered again: at most
the records in flight then.
A record that replaced exactly one left out (``delay-replaces``, as the journal's entry says)
stands: that record is gone because this one replaced it, not because it left before. One left
out itself (delivered, say) still replaces the record it names when the journal holds no fate of
that one: an exact replacement is stored only while its record waits, so that record left
because of it, and its entry never reached the journal (the process stopped between Redis and
the journal's write).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping

from bridge.catchup import LIVE_MARGIN_MS
from bridge.errors import BridgeError
from bridge.ingress.put_back import PutBack, Unsettled, before
from bridge.journal import Entry, Fate, JournalReader
from bridge.message import H_REPLACES, Cancel, Scheduled, origin, parse_origin
from bridge.metrics import Metrics
from bridge.store import ResumePoint, Shard, Store, due_hint, replaced_exactly

logger = logging.getLogger(__name__)


class Settled:
    """The journal's settled offsets of the partitions read again, until the read passes them."""

    def __init__(
        self,
        reader: Callable[[], JournalReader] | None,
        store: Store | None = None,
        topic_ids: Callable[[], Mapping[str, str]] = dict,
        before_read: Callable[[set[Shard]], None] = lambda shards: None,
        metrics: Metrics | None = None,
        hold: Callable[[Shard, bool], None] = lambda shard, held: None,
        strict: bool = False,
    ):
        self._reader = reader  # None: no journal
        # What is in flight of the partitions commits first (Egress.before_rebuild).
        self._before_read = before_read
        # The delay topics' ids as last heard: entries of an earlier incarnation are not these.
        self._topic_ids = topic_ids
        # Forgets in Redis what a rollback put back, holding a shard's claims (hold) until it has.
        self.put_back = PutBack(store, reader, topic_ids, metrics, hold, strict)
        self._offsets: dict[Shard, frozenset[int]] = {}
        self._last: dict[Shard, int] = {}
        self._start: dict[Shard, int] = {}  # where each is read again from
        # The records before the start that exact replacements name with no fate in the journal
        # (their entries never reached it), by the first replacement read of each: that one
        # took it, and a later one came after it (see _late).
        self._taken: dict[Shard, dict[int, int]] = {}
        # The origins of the records that replaced one of those, by the offset they replaced.
        self._replaced_by: dict[Shard, dict[int, str]] = {}
        # The offsets the journal holds another fate of (delivered, cancelled, dead-lettered),
        # before the start too: a record read again that replaces one of them exactly came too
        # late for it, as add.lua would have found had Redis known it (its state's floor).
        self._left: dict[Shard, frozenset[int]] = {}
        # The offsets the journal holds delivered: a recurring schedule's record among them is
        # carried on (or ended) by a record after it, so the registry has the schedule there.
        self._delivered: dict[Shard, frozenset[int]] = {}
        # The offsets the journal holds cancelled, before the start too: a schedule's record
        # among them ends its schedule there, whether its step was delivered too or not (a
        # cancel read while its occurrence was in flight or delivered, the record carrying it on
        # unread, ended it there), and a record carrying the schedule on from one is nothing.
        # One replaced by a record this re-read reads again is not: what replaced it says what
        # the registry has.
        # A record carrying the schedule on from one of them joins them, as it is left out.
        self._ended: dict[Shard, set[int]] = {}
        # The caller-given delay-ids of the records the journal settled from the start on, and
        # the due time of the record this re-read stored last that holds each (see _by_id).
        self._ids: dict[Shard, frozenset[str]] = {}
        self._holders: dict[Shard, dict[str, int]] = {}

    def load(
        self,
        starts: Mapping[Shard, int],
        ends: Mapping[Shard, int] | None = None,
        points: Mapping[Shard, ResumePoint] | None = None,
        unread: Collection[Shard] = (),
    ) -> dict[Shard, str]:
        """These partitions are read from these offsets (up to ``ends``, where each partition
        ended then; one that starts there has nothing to read again): learn what of them is
        settled. What the journal holds of their records before the start is forgotten in
        Redis, before their claims resume: Redis may have lost writes it had taken,
        acknowledgements among them, with nothing to tell (its watermark past the group's
        commit, and the replica that knew better dead). ``points`` are given at an assignment:
        each shard's resume point in Redis. The journal is read from when their start's record
        was produced, or from the last write Redis kept of them (``ResumePoint.written``) if
        that is earlier: the acknowledgements it lost came after — but only while records due
        wait in Redis (:meth:`PutBack.fates`), and one with nothing to read again is not read
        at all without them. What it holds up to the watermark is forgotten too, when the start
        is below it (a cancel kept to look for in other partitions): the re-read does not store
        those records again, Redis has them. Records found in flight are left leased, for the
        take-over's reconciliation to look up (bridge.journal.reconcile) — an earlier owner
        left them so, whether Redis lost anything or not. ``unread``: shards whose resume point
        Redis did not give at the assignment (it was loading its data set, say): it may hold
        any of their records, put back or not, so their claims wait until it answers and what
        the journal holds is forgotten there as above (:meth:`settle_held`). Nor do those of a
        shard whose forget Redis refused. Returns the partitions whose journal could not be read,
        exactly once (:attr:`PutBack.strict`), and why: none of their records may be stored
        until it is (the caller reads them again then)."""
        unreadable: dict[Shard, str] = {}
        if self._reader is None or not starts:
            return unreadable
        self._before_read(set(starts))
        self.put_back.after_redis(set(unread) & set(starts), starts, ends or {})
        reader, ids = self._reader(), self._topic_ids()
        try:
            for shard, start in starts.items():
                point = (points or {}).get(shard)
                at_end = start >= (ends or {}).get(shard, start + 1)
                try:
                    entries = self.put_back.fates(reader, shard, start, point, at_end, ids)
                except BridgeError as exc:
                    unreadable[shard] = str(exc)
                    continue
                if entries is None:
                    continue
                offsets = frozenset(e.offset for e in entries if e.offset >= start)
                # Those replaced before the start too: a rollback forgets them (below) in Redis.
                replaced = {e.offset: e.by for e in entries if e.fate == Fate.REPLACED}
                bys = [parse_origin(by) for by in replaced.values()]
                here = [p[2] for p in bys if p and p[:2] == (shard.topic, shard.partition)]
                left = frozenset(e.offset for e in entries if e.fate != Fate.REPLACED)
                ended = frozenset(e.offset for e in entries if _ended_by(e, shard, start))
                # A copy, or a record carrying an ended schedule on, read up to there may be late.
                end = (ends or {}).get(shard, 0) - 1
                last = [*offsets, *here, *([end] if (left or ended) and end >= 0 else [])]
                if last:
                    self._offsets[shard], self._last[shard] = offsets, max(last)
                    self._start[shard] = start
                    self._taken[shard] = {}
                    self._replaced_by[shard], self._left[shard] = replaced, left
                    self._delivered[shard] = frozenset(
                        e.offset for e in entries if e.fate == Fate.DELIVERED and e.offset >= start
                    )
                    self._ended[shard] = set(ended)
                    self._ids[shard] = frozenset(
                        e.delay_id
                        for e in entries
                        if e.offset >= start
                        and e.delay_id != origin(shard.topic, shard.partition, e.offset)
                    )
                    self._holders[shard] = {}
                if offsets:
                    logger.info(
                        "%s[%d] is read again from offset %d; the journal holds the fate of "
                        "%d records since, which are not scheduled again",
                        shard.topic,
                        shard.partition,
                        start,
                        len(offsets),
                    )
                if shard not in unread:  # else forgotten once Redis answers (settle_held)
                    put_back = before(entries, start, point)
                    self.put_back.forget(shard, Unsettled(start, at_end, put_back, points is None))
        finally:
            reader.close()
        return unreadable

    def settle_held(self) -> None:
        """Forget in Redis what :meth:`load` could not (Redis did not answer), releasing the
        claims of each partition done (:meth:`PutBack.retry`)."""
        self.put_back.retry()

    def has(self, shard: Shard, offset: int) -> bool:
        """Whether the journal holds the fate of the record at ``offset`` of ``shard`` (a re-read
        leaves it out)."""
        settled = self._offsets.get(shard)
        return settled is not None and offset in settled

    def drop(self, stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]]) -> int:
        """Leave out of ``stored`` (a batch's records by partition, with the highest offset
        read) the settled ones; returns how many. A recurring schedule's record whose step was
        delivered leaves a :attr:`Cancel.left_out` in its place: the schedule is at that record
        until the one carrying it on is read, as the registry had it before Redis lost it (a
        cancel read meanwhile in another partition ends it there). One cancelled, or carrying
        on a schedule the journal holds ended, leaves a :attr:`Cancel.left_withdrawn`: the
        schedule ended there."""
        dropped = 0
        for shard in [s for s in stored if s in self._offsets]:
            high, records = stored[shard]
            settled = self._offsets[shard]
            kept: list[Scheduled | Cancel] = []
            ended = self._ended.get(shard, set())
            holders = self._holders[shard]
            for r in records:
                if isinstance(r, Cancel):
                    holders.pop(r.delay_id, None)
                    kept.append(r)
                    continue
                late = self._late(shard, r)  # before settled is asked: it notes the first copy
                if r.continues is not None and r.continues in ended:
                    ended.add(r.offset)  # its schedule ended before it: it is nothing
                elif r.offset not in settled and not late:
                    kept.append(self._replacing(shard, r))
                    given = r.given_id(shard.topic, shard.partition)
                    if given is not None and given in self._ids[shard]:
                        holders[given] = r.due_ms  # one left out after it may have replaced it
                    continue
                dropped += 1
                left = (
                    self._left_out(shard, r)
                    or self._still_replacing(shard, r)
                    or self._by_id(shard, r)
                )
                if left is not None:
                    kept.append(left)
            stored[shard] = (high, kept)
            if high >= self._last[shard]:
                self._passed({shard})
        return dropped

    def _left_out(self, shard: Shard, record: Scheduled) -> Cancel | None:
        """What stands for ``record``, left out, in the store: a schedule's record with its own
        delay-id whose step the journal holds delivered is where the schedule is; one it holds
        cancelled, or one carrying on from such a record, is where the schedule ended."""
        if not record.recurring:
            return None
        given = record.given_id(shard.topic, shard.partition)
        if given is None:
            return None
        if record.offset in self._ended.get(shard, ()):
            return Cancel(record.offset, given, record.timestamp_ms, left_withdrawn=True)
        if record.offset in self._delivered.get(shard, ()):
            paused = record.carried_on_paused()
            return Cancel(record.offset, given, record.timestamp_ms, left_out=paused)
        return None

    def _still_replacing(self, shard: Shard, record: Scheduled) -> Cancel | None:
        """What stands for ``record``, left out as settled, when it replaced exactly a record
        this re-read reads again with no fate in the journal: that record left because this one
        replaced it (an exact replacement is stored only while its record waits), and is
        withdrawn again, journaled as replaced."""
        named = replaced_exactly(shard, record)
        if named is None or record.recurring or record.offset not in self._offsets[shard]:
            return None
        if named < self._start[shard] or named in self._offsets[shard]:
            return None
        hint = due_hint(record.headers)
        named_id = origin(shard.topic, shard.partition, named)
        return Cancel(record.offset, named_id, record.timestamp_ms, hint, replaces=True)

    def _by_id(self, shard: Shard, record: Scheduled) -> Cancel | None:
        """What stands for ``record``, left out as settled, when a record this re-read stored
        before it holds its caller-given delay-id, due at least LIVE_MARGIN_MS after ``record``
        was produced: ``record`` replaced that one when it was read, as a replacement produced
        that long before the due time always does (bridge.catchup), and the withdrawal's entry
        never reached the journal (see _still_replacing). That one is withdrawn again, journaled
        as replaced. One due sooner may have been in flight when ``record`` came (both were
        owed then): it stays."""
        if record.recurring or record.offset not in self._offsets[shard]:
            return None
        given = record.given_id(shard.topic, shard.partition)
        due = None if given is None else self._holders[shard].pop(given, None)
        if given is None or due is None or record.timestamp_ms + LIVE_MARGIN_MS > due:
            return None
        return Cancel(record.offset, given, record.timestamp_ms, replaces=True)

    def _late(self, shard: Shard, record: Scheduled) -> bool:
        """Whether ``record`` replaces exactly (``delay-replaces``: an operator's fire or
        reschedule) a record whose fate the journal holds, but for being replaced by it: that
        record left before this one came, and this one is nothing (see add.lua)."""
        named = replaced_exactly(shard, record)
        if named is None:
            return False
        if named in self._left.get(shard, ()):
            return True
        by = self._replaced_by[shard].get(named)
        if by is not None:
            return by != origin(shard.topic, shard.partition, record.offset)
        if named >= self._start[shard]:
            return False  # read again before this one: add.lua knows whether it waits
        # Before the start, with no fate in the journal: the first replacement read took it.
        return self._taken[shard].setdefault(named, record.offset) != record.offset

    def _replacing(self, shard: Shard, record: Scheduled | Cancel) -> Scheduled | Cancel:
        """``record``, or when it replaced exactly a record this re-read leaves out (the journal
        says it did: ``delay-replaces``), the same record without that header: that record is
        no longer waiting because this one replaced it, not too late for it."""
        if isinstance(record, Cancel):
            return record
        named = replaced_exactly(shard, record)
        if named is None:
            return record
        by = self._replaced_by[shard].get(named)
        if by != origin(shard.topic, shard.partition, record.offset):
            return record
        headers = [(k, v) for k, v in record.headers if k != H_REPLACES]
        return dataclasses.replace(record, headers=headers)

    def forget(self, shards: set[Shard]) -> None:
        """These partitions are no longer read here."""
        self.put_back.let_go(shards)
        self._passed(shards)

    def _passed(self, shards: set[Shard]) -> None:
        """The re-reads of these partitions passed the last record the journal settled."""
        for shard in shards & set(self._offsets):
            del self._offsets[shard], self._last[shard], self._replaced_by[shard]
            self._start.pop(shard, None)
            self._taken.pop(shard, None)
            self._left.pop(shard, None)
            self._delivered.pop(shard, None)
            self._ended.pop(shard, None)
            self._ids.pop(shard, None)
            self._holders.pop(shard, None)


def _ended_by(entry: Entry, shard: Shard, start: int) -> bool:
    """Whether the journal's ``entry`` says the schedule of its record (if it is one's) ended
    there for a re-read of ``shard`` from ``start``: cancelled; or replaced by a record the re-read
    does not read again (of another partition, or before the start)."""
    if entry.fate == Fate.CANCELLED:
        return True
    if entry.fate != Fate.REPLACED:
        return False
    by = parse_origin(entry.by)
    return by is not None and (by[:2] != (shard.topic, shard.partition) or by[2] < start)
