"""``delay-bridge trace``: the whole life of one record.

Redis tells what waits, the journal what happened before.
The journal is searched by time, never from its start: a record's fate sits on the journal
partition of its delay-topic partition (the partition a producer with murmur2 puts the key
``<topic>:<partition>`` on), written at or after its due time when it was delivered,
dead-lettered or expired, and between its storing and its due time when it was cancelled or
replaced. So the search reads from a minute before its due time on, then from when the record
was produced up to there, and stops at the first fate found; it decodes only the journal records
of the record's partition that hold its offset. A record known only by a delay-id of the
caller's that no longer waits has no due time to go by: the search reads every journal partition
from ``since`` (a day back by default), decoding only the journal records that hold that id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge import reads
from bridge.config import Config
from bridge.errors import BridgeError, UsageError
from bridge.journal import Entry, Fate, JournalReader, Sought, field_bytes
from bridge.message import Cancel, Scheduled, cut, format_time_ms, origin
from bridge.message import parse_origin as origin_parts
from bridge.store import Shard

MAX_USES = 20  # the records that held one id that trace shows at most, the latest
BEFORE_DUE_MS = 60_000  # the search for a final fate starts this long before the due time
DEFAULT_SINCE_MS = 24 * 3600 * 1000


@dataclass
class Traced:
    """What ``trace`` found: the record's fate and the events of its life, oldest first."""

    delay_id: str
    origin: str = ""
    fate: str = "unknown"
    events: list[dict[str, Any]] = field(default_factory=list)
    delivered: dict[str, Any] | None = None
    record: dict[str, Any] | None = None  # as produced to the delay topic: see preview()
    # The other records that held the delay-id (a replaced one, an earlier schedule), each with
    # its own origin, record and fate, the latest first; this one holds it now (or last did).
    uses: list[Traced] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {
            "id": self.delay_id,
            "origin": self.origin,
            "fate": self.fate,
            "events": self.events,
            "delivered": self.delivered,
            "record": self.record,
        }
        return out | {"uses": [u.as_json() for u in self.uses]} if self.uses else out


PREVIEW_BYTES = 1024


def preview(record: Scheduled) -> dict[str, Any]:
    """The record as read in the delay topic: its key, headers and the first
    :data:`PREVIEW_BYTES` of its value (as text, undecodable bytes replaced), and its size."""

    def text(data: bytes | None) -> str | None:
        return None if data is None else data.decode("utf-8", errors="replace")

    value = record.value or b""
    return {
        "key": text(record.key),
        "headers": [[name, text(data)] for name, data in record.headers],
        "value": text(value[:PREVIEW_BYTES]),
        "value_bytes": len(value),
    }


def parse_origin(text: str) -> tuple[Shard, int]:
    """``topic:partition:offset`` as (its shard, offset)."""
    parts = origin_parts(text)
    if parts is None:
        raise UsageError(f"--origin {cut(text)}: expected TOPIC:PARTITION:OFFSET")
    topic, partition, offset = parts
    return Shard(topic, partition), offset


def trace(
    config: Config,
    *,
    delay_id: str | None = None,
    at: str | None = None,
    topic: str | None = None,
    since_ms: int | None = None,
    now_ms: int,
) -> Traced:
    """The life of the record at origin ``at`` or with ``delay_id`` (see the module). A read of
    the journal goes back ``limits.max_delay`` at most (``since_ms``), the retention the
    journal is created with."""

    reads.check_since(since_ms, now_ms, config.limits.max_delay)
    if at is None and delay_id is not None:
        uses = _uses(config, delay_id, topic=topic, since_ms=since_ms, now_ms=now_ms)
        if uses:
            uses[0].uses = uses[1:]
            return uses[0]
        if origin_parts(delay_id) is None:
            return Traced(delay_id)  # no record holds it, nor did
        at = delay_id  # a default delay-id is its origin: the record there, whatever its id
    assert at is not None
    shard, offset = parse_origin(at)
    traced = Traced(delay_id or "", origin(shard.topic, shard.partition, offset))
    reader = JournalReader(config)
    try:
        end = reader.delay_end(shard)
        if offset >= end:
            raise UsageError(
                f"{cut(shard.topic)} partition {shard.partition} ends at offset {end}: "
                f"no record is at {offset} yet"
            )
        record, produced_ms = reader.delay_record(shard, offset)
        waiting: Scheduled | None = None
        if isinstance(record, Scheduled):
            traced.delay_id = record.delay_id
            traced.record = preview(record)
            traced.events.append(_stored(record, produced_ms))
            waiting = _waiting(config, shard, record.delay_id, offset)
        if waiting is not None:
            traced.fate = "waiting"
            traced.events.append({"event": "waiting", "due": waiting.due_ms})
            return traced
        # From when it was produced; a record the log no longer holds is looked for from the
        # journal's retention (limits.max_delay) back, not from its first record.
        first = next(
            t for t in (since_ms, produced_ms, now_ms - config.limits.max_delay) if t is not None
        )
        entries = _search(reader, shard, offset, record, first)
    finally:
        reader.close()
    for _, entry in entries:
        traced.delay_id = traced.delay_id or entry.delay_id
        _add_entry(traced, entry)
    if traced.fate == "unknown" and _in_flight(config, shard, offset):
        traced.fate = "in-flight"  # claimed, no fate journaled yet
        traced.events.append({"event": "in-flight"})
    return traced


def _uses(
    config: Config, delay_id: str, *, topic: str | None, since_ms: int | None, now_ms: int
) -> list[Traced]:
    """Each record that held ``delay_id`` — waiting now (:func:`bridge.ops.records.locate`), or
    in the journal's entries with that id since ``since_ms`` (a day back by default) —, traced on
    its own (its origin, its record as produced, its fate): waiting ones first, then by their
    last event, the latest first, :data:`MAX_USES` at most. [] when none did."""
    from bridge.ops.records import locate

    waiting: dict[tuple[Shard, int], Scheduled] = {}
    for name in [topic] if topic else list(config.topics.delay):
        for shard, rec in locate(config, name, delay_id).found:
            waiting[shard, rec.offset] = rec
    reader = JournalReader(config)
    try:
        entries: dict[tuple[Shard, int], list[Entry]] = {}
        if reader.journal:
            start = since_ms if since_ms is not None else now_ms - DEFAULT_SINCE_MS
            found = _search_id(reader, delay_id, start, topic)
            for entry_shard, entry in found:
                entries.setdefault((entry_shard, entry.offset), []).append(entry)
        elif not waiting:
            raise BridgeError('topics.journal is "": no journal, only waiting records are traced')
        uses: list[tuple[Traced, Shard, int]] = []
        for shard, offset in waiting.keys() | entries.keys():
            use = Traced(delay_id, origin(shard.topic, shard.partition, offset))
            for entry in entries.get((shard, offset), []):
                _add_entry(use, entry)
            if (shard, offset) in waiting:
                use.fate = "waiting"
                use.events.append({"event": "waiting", "due": waiting[shard, offset].due_ms})
            elif use.fate == "unknown" and _in_flight(config, shard, offset):
                use.fate = "in-flight"
                use.events.append({"event": "in-flight"})
            uses.append((use, shard, offset))

        def latest(found: tuple[Traced, Shard, int]) -> tuple[bool, int]:
            use = found[0]
            return use.fate in ("waiting", "in-flight"), max(e.get("at", 0) for e in use.events)

        kept = sorted(uses, key=latest, reverse=True)[:MAX_USES]
        for use, shard, offset in kept:  # as produced: read in the delay topic
            record, produced_ms = reader.delay_record(shard, offset)
            if isinstance(record, Scheduled):
                use.record = preview(record)
                use.events.insert(0, _stored(record, produced_ms))
    finally:
        reader.close()
    return [use for use, _, _ in kept]


# The fate ``trace`` gives a recurring schedule's step that delivered no occurrence (skipped,
# paused, or carried on between occurrences): journaled as delivered with no target.
CARRIED_ON = "carried-on"


def _fate(entry: Entry) -> str:
    if entry.fate is Fate.DELIVERED and not entry.target:
        return CARRIED_ON
    return entry.fate.value


def _add_entry(traced: Traced, entry: Entry) -> None:
    """A journal entry of ``traced``'s record: its fate so far, an event, where it went."""
    traced.fate = _fate(entry)
    traced.events.append(_event(entry))
    if entry.fate is Fate.DELIVERED and entry.target:
        traced.delivered = {
            "topic": entry.target,
            "partition": entry.target_partition,
            "offset": entry.target_offset,
            "at": entry.at_ms,
        }


def _in_flight(config: Config, shard: Shard, offset: int) -> bool:
    from bridge.ops.records import store_of

    store = store_of(config)
    try:
        return store.inventory.in_flight(shard, offset)
    finally:
        store.client.close()


def _waiting(config: Config, shard: Shard, delay_id: str, offset: int) -> Scheduled | None:
    from bridge.ops.records import locate

    for found_shard, rec in locate(config, shard.topic, delay_id).found:
        if found_shard == shard and rec.offset == offset:
            return rec
    return None


def _stored(record: Scheduled, produced_ms: int | None) -> dict[str, Any]:
    event: dict[str, Any] = {"event": "stored", "due": record.due_ms, "target": record.target}
    if produced_ms is not None:
        event["at"] = produced_ms
    return event


def _event(entry: Entry) -> dict[str, Any]:
    event: dict[str, Any] = {"event": _fate(entry), "at": entry.at_ms, "due": entry.due_ms}
    if entry.target:
        event.update(
            topic=entry.target, partition=entry.target_partition, offset=entry.target_offset
        )
    if entry.fate is Fate.DELIVERED and entry.target:
        event["late_ms"] = max(0, entry.at_ms - entry.due_ms)
    if entry.by:
        event["by"] = entry.by
    if entry.reason:
        event["reason"] = entry.reason
    return event


def _search_id(
    reader: JournalReader, delay_id: str, start_ms: int, topic: str | None
) -> list[tuple[Shard, Entry]]:
    """The journal's entries with ``delay_id`` (of ``topic``'s records, when given) written from
    ``start_ms`` on, in every journal partition, oldest first."""
    found: list[tuple[Shard, Entry]] = []
    by_id = Sought(needle=field_bytes("id", delay_id))
    for partition in range(reader.partitions()):
        found += reader.scan(
            partition,
            start_ms,
            None,
            lambda s, e: e.delay_id == delay_id and (topic is None or s.topic == topic),
            by_id,
        )
    return sorted(found, key=lambda se: se[1].at_ms)


def _search(
    reader: JournalReader,
    shard: Shard,
    offset: int,
    record: Scheduled | Cancel | None,
    first_ms: int,
) -> list[tuple[Shard, Entry]]:
    """The journal's entries for the record at ``offset`` of ``shard`` (``record``, if the log
    still holds it) written from ``first_ms`` on, oldest first."""
    if not reader.journal:
        raise BridgeError('topics.journal is "": no journal, only waiting records are traced')
    partition = reader.partition_of(shard)
    sought = Sought(shard, field_bytes("offset", offset), first=True)  # one fate, then done

    def mine(_: Shard, e: Entry) -> bool:
        return e.offset == offset

    if not isinstance(record, Scheduled):
        return reader.scan(partition, first_ms, None, mine, sought)
    split = max(first_ms, record.due_ms - BEFORE_DUE_MS)
    late = reader.scan(partition, split, None, mine, sought)
    return late or reader.scan(partition, first_ms, split, mine, sought)


def print_trace(traced: Traced) -> None:
    """``trace`` for a person: a few lines."""
    print(f"delay-id  {traced.delay_id or '-'}")
    print(f"origin    {traced.origin or '-'}")
    print(f"fate      {traced.fate}")
    for event in traced.events:
        when = format_time_ms(event["at"]) if "at" in event else "-" * 24
        print(f"{when}  {event['event']:<13}  {_detail(event)}")
    if traced.uses:
        print(f"other records that held {traced.delay_id} (trace --origin for each):")
        for use in traced.uses:
            print(f"  {use.origin}  {use.fate}")


def _detail(event: dict[str, Any]) -> str:
    parts = [f"due {format_time_ms(event['due'])}"] if "due" in event else []
    if event["event"] == "stored":
        parts.append(f"to {event['target']}")
    if "topic" in event:
        parts.append(f"at {event['topic']}[{event['partition']}]@{event['offset']}")
    if "late_ms" in event:
        parts.append(f"{event['late_ms']:,} ms after due")
    if "by" in event:
        parts.append(f"by {event['by']}")
    if "reason" in event:
        parts.append(event["reason"])
    return ", ".join(parts)
