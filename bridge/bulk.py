"""Bulk operations of the command line: every waiting record a filter matches, and its cancel.

The records are found in Redis (:meth:`Inventory.scan`: the due index, the wait indexes and the
references of each partition, a page at a time), a reference's key and target read in the delay
topic as the read-back reads them when a filter needs them. Each match is cancelled through a
record produced to the partition where it waits — never by editing Redis — so the bridge applies
it in offset order like any cancel, the journal records it, and a Redis rebuild keeps it. On this
contract's topics the cancel names the record by its origin (its default delay-id, exact: a
replacement produced since is a schedule of its own) with its due time as the hint that finds it
at once (see :class:`bridge.message.Cancel`); on an etf1 or kaspr topic, by its delay-id, as
that dialect cancels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bridge.config import Config, read_back_settings
from bridge.dialects import ETF1, KASPR, KASPR_ACTION, KASPR_CANCEL, KASPR_REQUEST_ID
from bridge.message import H_CANCEL, H_DUE_AT, Headers, Scheduled, origin
from bridge.ops import store_of
from bridge.store import REFERENCE_BYTES, Shard, references_in, stored_record

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

    def matches(self, record: Scheduled) -> bool:
        """Whether ``record`` (a waiting one, within the due bounds) matches the rest."""
        if self.target is not None and record.target != self.target:
            return False
        return self.key_prefix is None or (record.key or b"").startswith(self.key_prefix)


@dataclass(frozen=True, slots=True)
class Match:
    """A waiting record a filter matched: where it waits, its due time, its key and delay-id
    (those two None for a reference not read back: no filter needed them)."""

    shard: Shard
    offset: int
    due_ms: int
    key: bytes | None
    delay_id: str | None


def matches(
    config: Config, shards: Sequence[Shard], flt: Filter, *, read_all: bool = False
) -> Iterator[Match]:
    """The waiting records of ``shards`` ``flt`` matches, a partition at a time, in no order; a
    record is given once. ``read_all``: every reference is read back (its key and delay-id are
    needed), not only when the filter needs it."""
    from confluent_kafka import Consumer

    from bridge.readback import Reader, missing_record, parse_read_back

    store = store_of(config)
    rules = config.rules()
    reader: Reader | None = None
    try:
        for shard in shards:
            seen: set[int] = set()
            for page in store.inventory.scan(shard, flt.due_after_ms, flt.due_before_ms):
                now_ms = store.time_ms()
                refs = [(due, m) for due, m in page if len(m) == REFERENCE_BYTES]
                read: dict[int, Scheduled] = {}
                if refs and (read_all or flt.reads_records):
                    if reader is None:
                        reader = Reader(Consumer({**read_back_settings(config), "log_level": 0}))
                    wanted = sorted(references_in(m)[0] for _, m in refs)
                    got = reader.read(shard, [o for o, _ in wanted])
                    for o, d in wanted:
                        msg = got.get(o)
                        read[o] = (
                            missing_record(shard, o, d, "gone from the delay topic")
                            if msg is None
                            else parse_read_back(rules, shard, (o, d), msg, now_ms)[0]
                        )
                for due, member in page:
                    if len(member) == REFERENCE_BYTES:
                        offset = references_in(member)[0][0]
                        rec = read.get(offset)
                    else:
                        rec = stored_record(member, shard, now_ms)
                        offset = rec.offset
                    if offset in seen or (rec is not None and not flt.matches(rec)):
                        continue
                    seen.add(offset)
                    key, delay_id = (None, None) if rec is None else (rec.key, rec.delay_id)
                    yield Match(shard, offset, due, key, delay_id)
    finally:
        if reader is not None:
            reader.close()
        store.client.close()


def cancel_of(match: Match, dialect: str | None) -> Outgoing:
    """The record that cancels ``match``, in its topic's dialect (see the module docstring)."""
    shard = match.shard
    if dialect == ETF1:
        return match.delay_id.encode() if match.delay_id else None, None, [], shard.partition
    if dialect == KASPR:
        request = (match.delay_id or "").encode()
        headers: Headers = [(KASPR_ACTION, KASPR_CANCEL.encode()), (KASPR_REQUEST_ID, request)]
        return match.key, b"", headers, shard.partition
    named = origin(shard.topic, shard.partition, match.offset).encode()
    hint = b"%d" % match.due_ms
    return match.key, b"", [(H_CANCEL, named), (H_DUE_AT, hint)], shard.partition


@dataclass
class Tally:
    """Matches counted per partition, as a bulk operation reports them."""

    counts: Counter[Shard]

    def table(self) -> str:
        return ", ".join(f"{s.topic}:{s.partition} {n:,}" for s, n in sorted(self.counts.items()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())
