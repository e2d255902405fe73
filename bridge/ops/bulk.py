"""The waiting records a filter matches, and the records that cancel, fire or reschedule them.

The records are found in Redis (:meth:`Inventory.scan`: the due index, the wait indexes and the
references of each partition, a page at a time), a reference's key and target read in the delay
topic as the read-back reads them when a filter needs them. Each match is cancelled through a
record produced to the partition where it waits — never by editing Redis — so the bridge applies
it in offset order like any cancel, the journal records it, and a Redis rebuild keeps it. On this
contract's topics the cancel names the record by its origin (its default delay-id, exact: a
replacement produced since is a schedule of its own) with its due time as the hint that finds it
at once (see :class:`bridge.message.Cancel`); on an etf1 or kaspr topic, by its delay-id, as
that dialect cancels. Firing or rescheduling one is a replacement (:func:`replacement_of`): the
record again, with its delay-id (its origin when it has none of its own) and a new due time. A
command follows the bridge applying what it produced (:class:`Follow`): the records other
producers send to those partitions meanwhile wait behind little of it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from bridge.config import Config, read_back_settings
from bridge.dialects import ETF1, KASPR, KASPR_ACTION, KASPR_CANCEL, KASPR_REQUEST_ID
from bridge.lookup import records_at
from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ID,
    H_OPERATION,
    H_REPLACES,
    Headers,
    Rules,
    Scheduled,
    origin,
)
from bridge.ops.records import store_of
from bridge.store import REFERENCE_BYTES, Shard, Store, offset_of, references_in, stored_record

if TYPE_CHECKING:
    from confluent_kafka import Message

    from bridge.readback import Reader

Outgoing = tuple[bytes | None, bytes | None, Headers, int | None]  # key, value, headers, partition


@dataclass(frozen=True)
class Filter:
    """Which waiting records a bulk operation takes: all that are given must match."""

    target: str | None = None
    key_prefix: bytes | None = None
    due_after_ms: int | None = None  # due at or after
    due_before_ms: int | None = None  # due before

    @property
    def reads_records(self) -> bool:
        """Whether a reference must be read in the delay topic to be matched."""
        return self.target is not None or self.key_prefix is not None

    def due_within(self, due_ms: int) -> bool:
        """Whether a record due at ``due_ms`` is within the due bounds."""
        after, before = self.due_after_ms, self.due_before_ms
        return (after is None or due_ms >= after) and (before is None or due_ms < before)

    def matches(self, record: Scheduled) -> bool:
        """Whether ``record`` (a waiting one, within the due bounds) matches the rest."""
        if self.target is not None and record.target != self.target:
            return False
        return self.key_prefix is None or (record.key or b"").startswith(self.key_prefix)


@dataclass(frozen=True, slots=True)
class Match:
    """A waiting record a filter matched: where it waits, its due time, and the record (None for
    a reference not read back: nothing needed it)."""

    shard: Shard
    offset: int
    due_ms: int
    record: Scheduled | None
    done: bool = False  # it carries the operation's own id: the operation made it

    @property
    def key(self) -> bytes | None:
        return None if self.record is None else self.record.key

    @property
    def delay_id(self) -> str | None:
        return None if self.record is None else self.record.delay_id


class Snapshot(NamedTuple):
    """What a bulk operation takes: per shard, the offset its records are below (the ingest
    watermark's next), and the recurring schedules live (delay-id -> the offset of the record each
    was at), read before it — each schedule is in the snapshot wherever its occurrence is when the
    scan comes to it."""

    below: Mapping[Shard, int]
    schedules: Mapping[Shard, Mapping[str, int]]


def snapshot(store: Store, shards: Sequence[Shard]) -> Snapshot:
    """The :class:`Snapshot` of ``shards`` now."""
    schedules = store.registry.running(shards)
    below = {s: mark + 1 for s, mark in store.inventory.watermarks(shards).items()}
    return Snapshot(below, schedules)


def matches(
    config: Config,
    shards: Sequence[Shard],
    flt: Filter,
    *,
    read_all: bool = False,
    snapshot: Snapshot | None = None,
    operation: str | None = None,
) -> Iterator[Match]:
    """The waiting records of ``shards`` ``flt`` matches, a partition at a time, in no order; a
    record is given once. ``read_all``: every reference is read back (its key and delay-id are
    needed), not only when the filter needs it. ``snapshot``: a shard's records stored after it
    (its own among them) are left out, and its schedules are matched wherever they are now
    (:func:`_moved_on`); without one, every record waiting. ``operation``: a record that carries
    that id (``delay-operation``: the operation made it) is given as ``done``."""
    store = store_of(config)
    reads = _ReadBack(config, flt, read_all)
    try:
        for shard in shards:
            bound = snapshot.below.get(shard, 0) if snapshot is not None else None
            seen: set[int] = set()
            # The offsets the scan met, and the delay-ids of the schedules among their records:
            # matched or not, those schedules are decided (see _moved_on).
            met: set[int] = set()
            named: set[str] = set()
            for scanned in store.inventory.scan(shard, flt.due_after_ms, flt.due_before_ms):
                page = [(d, m) for d, m in scanned if bound is None or offset_of(m) < bound]
                now_ms = store.time_ms()
                refs = {m: references_in(m)[0] for _, m in page if len(m) == REFERENCE_BYTES}
                read, keyed = reads.page(shard, refs.values(), now_ms)
                met.update(offset_of(m) for _, m in page)
                for due, member in page:
                    ref = refs.get(member)
                    rec: Scheduled | None
                    if ref is None:
                        whole = stored_record(member, shard, now_ms)
                        offset, rec = whole.offset, whole
                    elif reads.key_only and ref[0] not in keyed:
                        continue
                    else:
                        offset, rec = ref[0], read.get(ref[0])  # None: not read
                    if rec is not None and rec.recurring:
                        named.add(rec.delay_id)
                    if offset in seen or (rec is not None and not flt.matches(rec)):
                        continue
                    seen.add(offset)
                    done = operation is not None and rec is not None and made_by(rec, operation)
                    yield Match(shard, offset, due, rec, done)
            if snapshot is not None:
                live = snapshot.schedules.get(shard, {})
                yield from _moved_on(reads, shard, flt, live, met, named, store.time_ms())
    finally:
        reads.close()
        store.client.close()


class _ReadBack:
    """The references a bulk operation reads in the delay topic, a page at a time (one consumer,
    made when first needed): all of them with ``read_all``, else those a filter on target or key
    needs; a key prefix alone is decided by a reference's key (``key_only``: not parsed)."""

    def __init__(self, config: Config, flt: Filter, read_all: bool) -> None:
        self.config = config
        self.rules = config.rules()
        self.needed = read_all or flt.reads_records
        self.key_only = flt.key_prefix is not None and flt.target is None and not read_all
        self.prefix = flt.key_prefix or b""
        self.reader: Reader | None = None

    def page(
        self, shard: Shard, refs: Collection[tuple[int, int]], now_ms: int
    ) -> tuple[dict[int, Scheduled], set[int]]:
        """The records the references ``refs`` (offset, due ms) stand for, read back; with
        ``key_only`` none, and instead the offsets of those whose key has the prefix."""
        if not refs or not self.needed:
            return {}, set()
        wanted = sorted(refs)
        got = self.consumer().read(shard, [o for o, _ in wanted])
        if self.key_only:
            prefix = self.prefix
            return {}, {
                o for o, m in got.items() if m is not None and (m.key() or b"").startswith(prefix)
            }
        return _parsed(self.rules, shard, wanted, got, now_ms), set()

    def consumer(self) -> Reader:
        """The reader the pages and the schedules that moved on are read with, made once."""
        if self.reader is None:
            from confluent_kafka import Consumer

            from bridge.readback import Reader

            self.reader = Reader(Consumer({**read_back_settings(self.config), "log_level": 0}))
        return self.reader

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def _parsed(
    rules: Rules,
    shard: Shard,
    wanted: Sequence[tuple[int, int]],
    got: Mapping[int, Message | None],
    now_ms: int,
) -> dict[int, Scheduled]:
    """The records the references ``wanted`` (offset, due ms) stand for, read back as ``got``."""
    from bridge.readback import missing_record, parse_read_back

    read: dict[int, Scheduled] = {}
    for o, d in wanted:
        msg = got.get(o)
        if msg is None:
            read[o] = missing_record(shard, o, d, "gone from the delay topic")
        else:
            read[o] = parse_read_back(rules, shard, (o, d), msg, now_ms)[0]
    return read


def _moved_on(
    reads: _ReadBack,
    shard: Shard,
    flt: Filter,
    live: Mapping[str, int],
    met: Collection[int],
    named: Collection[str],
    now_ms: int,
) -> Iterator[Match]:
    """The schedules ``live`` in ``shard`` at the snapshot that its scan did not meet (neither
    the record each was at, in ``met``, nor its delay-id, in ``named``): their occurrence was in
    flight, or they moved on to a record stored after the snapshot (or, with due bounds, they
    wait outside them). A schedule's target, key and payload are the same whichever record
    carries it, so each is matched by the record it was at, read in the delay topic (by the
    consumer of ``reads``); its cancel names its delay-id and ends it wherever it is now
    (:func:`cancel_of`). One whose record is gone from the delay topic is not matched (the
    schedule outlives retention on a record the bridge writes again: the live one is recent)."""
    wanted = {at: sid for sid, at in live.items() if at not in met and sid not in named}
    if not wanted:
        return
    for record in records_at(reads.config, shard, sorted(wanted), now_ms, reads.consumer()):
        if (
            record.recurring
            and record.delay_id == wanted[record.offset]
            and flt.due_within(record.due_ms)
            and flt.matches(record)
        ):
            yield Match(shard, record.offset, record.due_ms, record)


def made_by(record: Scheduled, operation: str) -> bool:
    """Whether ``record`` is one that ``operation`` produced (its ``delay-operation``)."""
    mark = operation.encode()
    return any(k == H_OPERATION and v == mark for k, v in record.headers)


def cancel_of(match: Match, dialect: str | None) -> Outgoing:
    """The record that cancels ``match``, in its topic's dialect (see the module docstring)."""
    shard = match.shard
    if dialect == ETF1:
        return match.delay_id.encode() if match.delay_id else None, None, [], shard.partition
    if dialect == KASPR:
        request = (match.delay_id or "").encode()
        headers: Headers = [(KASPR_ACTION, KASPR_CANCEL.encode()), (KASPR_REQUEST_ID, request)]
        return match.key, b"", headers, shard.partition
    if match.record is not None and match.record.recurring:
        # A schedule moves on to a new record at each occurrence, within its partition: by the
        # time the cancel is read, the record matched may be gone and the schedule further on.
        # Its delay-id (required, its identity) ends it wherever it is.
        named = match.record.delay_id.encode()
    else:
        named = origin(shard.topic, shard.partition, match.offset).encode()
    hint = b"%d" % match.due_ms
    return match.key, b"", [(H_CANCEL, named), (H_DUE_AT, hint)], shard.partition


# Cancels a record names at most: its headers take ~60 bytes each, and the bridge applies a
# record's cancels in one Redis call (about 10 ms for 500).
PACKED = 100


def packed(cancels: Iterator[Outgoing], operation: str, most: int = PACKED) -> Iterator[Outgoing]:
    """The cancels of this contract's topics (:func:`cancel_of`), those of one partition in a
    row packed into records of up to ``most`` (a ``delay-cancel`` and its ``delay-due-at`` each,
    in order), each with the ``operation``'s id: the bridge applies each as a cancel of its own,
    at a fraction of a record's cost each."""
    headers: Headers = []
    partition: int | None = None
    mark = (H_OPERATION, operation.encode())
    for _, _, named, where in cancels:
        if headers and (where != partition or len(headers) >= 2 * most):
            yield None, b"", [*headers, mark], partition
            headers = []
        headers += named
        partition = where
    if headers:
        yield None, b"", [*headers, mark], partition


# A replacement's new due time comes from these; the old one is the hint that finds it; the
# operation that made it, and the record it replaces, are the ones replacing it now.
REPLACED_HEADERS = frozenset({H_DELIVER_AT, H_AFTER, H_ID, H_DUE_AT, H_OPERATION, H_REPLACES})


def replacement_of(
    match: Match, due_ms: int | None, operation: str | None = None
) -> Outgoing | None:
    """The record that replaces ``match`` (read: its record is known), due at ``due_ms`` (None:
    now, ``delay-after: 0``), with the bulk ``operation``'s id if one makes it — or None for one
    bound for the DLQ (its payload gone: nothing to deliver). It replaces that record exactly
    (``delay-replaces``: its origin): if the record was claimed, delivered, cancelled or replaced
    before the bridge reads this one, nothing is scheduled (no record is delivered twice)."""
    rec = match.record
    if rec is None or rec.dead_letter:
        return None
    kept = [(k, v) for k, v in rec.headers if k not in REPLACED_HEADERS]
    when = (H_AFTER, b"0") if due_ms is None else (H_DELIVER_AT, b"%d" % due_ms)
    exactly = origin(match.shard.topic, match.shard.partition, match.offset).encode()
    named = [(H_ID, rec.delay_id.encode()), (H_DUE_AT, b"%d" % match.due_ms), (H_REPLACES, exactly)]
    if operation is not None:
        named.append((H_OPERATION, operation.encode()))
    return rec.key, rec.value, [*kept, when, *named], match.shard.partition


@dataclass
class Tally:
    """Matches counted per partition, as a bulk operation reports them."""

    counts: Counter[Shard]

    def table(self) -> str:
        return ", ".join(f"{s.topic}:{s.partition} {n:,}" for s, n in sorted(self.counts.items()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# What a bulk command keeps produced that the bridge has not applied yet, at most (records acted
# on: a cancel of a record of cancels counts one): the records other producers send to those
# partitions meanwhile wait behind no more than that, ~0.25 s of the bridge's work beside a
# live load (docs/bench/history.md, "Bulk operations").
AHEAD = 2_000
STALL_S = 3.0  # the bridge applied none of it this long: it is not running, so wait no more
LOOK_S = 0.02  # how often the watermarks are read while waiting


class Follow:
    """Paces a bulk command by the bridge: :meth:`wait` holds it while more than ``ahead`` of
    what it produced is not applied yet (a record applied once the shard's ingest watermark in
    Redis reaches its offset). When the bridge applies nothing for ``stall_s`` — none runs, or
    its partitions are not read — the command stops waiting for the rest of its run
    (:attr:`stalled`)."""

    def __init__(
        self,
        topic: str,
        watermarks: Callable[[Sequence[Shard]], Mapping[Shard, int]],
        *,
        ahead: int = AHEAD,
        stall_s: float = STALL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self.watermarks = watermarks  # Inventory.watermarks: the ingest watermark of each shard
        self.ahead = ahead
        self.stall_s = stall_s
        self.clock = clock
        self.produced = 0  # records acted on, produced
        self.applied = 0  # of them, applied by the bridge
        self.stalled = False
        self._acked: dict[int, deque[tuple[int, int]]] = {}  # partition -> (offset, acted)

    def sent(self, acted: int) -> None:
        """A record acting on ``acted`` records was produced."""
        self.produced += acted

    def acknowledged(self, partition: int, offset: int, acted: int) -> None:
        """Kafka took that record at ``offset`` of ``partition``."""
        self._acked.setdefault(partition, deque()).append((offset, acted))

    def wait(self, serve: Callable[[float], object], ahead: int | None = None) -> None:
        """Return once at most ``ahead`` records (:attr:`ahead` when None; 0 at the end: all)
        are not applied, or at once when stalled; ``serve(seconds)`` serves the producer's
        delivery reports meanwhile."""
        most = self.ahead if ahead is None else ahead
        progress_at = self.clock()
        while not self.stalled and self.produced - self.applied > most:
            serve(LOOK_S)
            before = self.applied
            self._catch_up()
            if self.applied > before:
                progress_at = self.clock()
            elif self.clock() - progress_at > self.stall_s:
                self.stalled = True

    def _catch_up(self) -> None:
        shards = [Shard(self.topic, p) for p in self._acked]
        marks = self.watermarks(shards)
        for shard, mark in marks.items():
            acked = self._acked[shard.partition]
            while acked and acked[0][0] <= mark:
                self.applied += acked.popleft()[1]
