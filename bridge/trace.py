"""``delay-bridge trace``: the whole life of one record.

Redis tells what waits, the journal what happened before.
The journal is searched by time, never from its start: a record's fate sits on the journal
partition of its delay-topic partition (the partition a producer with murmur2 puts the key
``<topic>:<partition>`` on), written at or after its due time when it was delivered,
dead-lettered or expired, and between its storing and its due time when it was cancelled or
replaced. So the search reads from a minute before its due time to the end of that partition
first, then from when the record was produced up to there. A record known only by a delay-id of
the caller's that no longer waits has no due time to go by: the search reads every journal
partition from ``since`` (a day back by default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from bridge.client import partition_for
from bridge.config import Config, read_back_settings
from bridge.dialects import parse_record
from bridge.errors import BridgeError, UsageError
from bridge.journal import Entry, Fate, decode_entries, journal_key
from bridge.kafka import headers_of
from bridge.message import Cancel, Rejected, Scheduled, format_time_ms, origin
from bridge.store import Shard

BEFORE_DUE_MS = 60_000  # the search for a final fate starts this long before the due time
DEFAULT_SINCE_MS = 24 * 3600 * 1000
TIMEOUT_S = 10.0
_ORIGIN = re.compile(r"^([A-Za-z0-9._-]+):(\d+):(\d+)$")


@dataclass
class Traced:
    """What ``trace`` found: the record's fate and the events of its life, oldest first."""

    delay_id: str
    origin: str = ""
    fate: str = "unknown"
    events: list[dict[str, Any]] = field(default_factory=list)
    delivered: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.delay_id,
            "origin": self.origin,
            "fate": self.fate,
            "events": self.events,
            "delivered": self.delivered,
        }


def parse_origin(text: str) -> tuple[Shard, int]:
    """``topic:partition:offset`` as (its shard, offset)."""
    match = _ORIGIN.match(text)
    if match is None:
        raise UsageError(f"--origin {text}: expected TOPIC:PARTITION:OFFSET")
    return Shard(match.group(1), int(match.group(2))), int(match.group(3))


def trace(
    config: Config,
    *,
    delay_id: str | None = None,
    at: str | None = None,
    topic: str | None = None,
    since_ms: int | None = None,
    now_ms: int,
) -> Traced:
    """The life of the record at origin ``at`` or with ``delay_id`` (see the module)."""
    from bridge import ops

    if at is None and delay_id is not None and _ORIGIN.match(delay_id):
        at = delay_id  # a default delay-id is its origin
    shard, offset = parse_origin(at) if at is not None else (None, -1)
    traced = Traced(delay_id or "")
    waiting: Scheduled | None = None
    if shard is None:
        assert delay_id is not None
        topics = [topic] if topic else list(config.topics.delay)
        for name in topics:
            _, found = ops.locate(config, name, delay_id)
            if found:
                shard, waiting = found[0]
                offset = waiting.offset
                break
    reader = _JournalReader(config)
    try:
        record, produced_ms = (None, None) if shard is None else reader.delay_record(shard, offset)
        if shard is not None:
            traced.origin = origin(shard.topic, shard.partition, offset)
            if isinstance(record, Scheduled):
                traced.delay_id = record.delay_id
                traced.events.append(_stored(record, produced_ms))
            if waiting is None and isinstance(record, Scheduled):
                waiting = _waiting(config, shard, record.delay_id, offset)
        if waiting is not None:
            traced.fate = "waiting"
            traced.events.append({"event": "waiting", "due": waiting.due_ms})
            return traced
        entries = reader.search(shard, offset, traced.delay_id, record, produced_ms,
                                since_ms=since_ms, now_ms=now_ms, topic=topic)  # fmt: skip
        if shard is None and entries:  # found by its id alone: where it was stored, now known
            shard, offset = entries[0][0], entries[0][1].offset
            record, produced_ms = reader.delay_record(shard, offset)
            if isinstance(record, Scheduled):
                traced.events.append(_stored(record, produced_ms))
    finally:
        reader.close()
    for entry_shard, entry in entries:
        if not traced.origin:
            traced.origin = origin(entry_shard.topic, entry_shard.partition, entry.offset)
        traced.delay_id = traced.delay_id or entry.delay_id
        traced.fate = entry.fate.value
        traced.events.append(_event(entry))
        if entry.fate is Fate.DELIVERED:
            traced.delivered = {
                "topic": entry.target,
                "partition": entry.target_partition,
                "offset": entry.target_offset,
                "at": entry.at_ms,
            }
    if traced.fate == "unknown" and shard is not None and _in_flight(config, shard, offset):
        traced.fate = "in-flight"  # claimed, no fate journaled yet
        traced.events.append({"event": "in-flight"})
    return traced


def _in_flight(config: Config, shard: Shard, offset: int) -> bool:
    from bridge import ops

    store = ops.store_of(config)
    try:
        return store.inventory.in_flight(shard, offset)
    finally:
        store.client.close()


def _waiting(config: Config, shard: Shard, delay_id: str, offset: int) -> Scheduled | None:
    from bridge import ops

    for found_shard, rec in ops.locate(config, shard.topic, delay_id)[1]:
        if found_shard == shard and rec.offset == offset:
            return rec
    return None


def _stored(record: Scheduled, produced_ms: int | None) -> dict[str, Any]:
    event: dict[str, Any] = {"event": "stored", "due": record.due_ms, "target": record.target}
    if produced_ms is not None:
        event["at"] = produced_ms
    return event


def _event(entry: Entry) -> dict[str, Any]:
    event: dict[str, Any] = {"event": entry.fate.value, "at": entry.at_ms, "due": entry.due_ms}
    if entry.target:
        event.update(topic=entry.target, partition=entry.target_partition,
                     offset=entry.target_offset)  # fmt: skip
    if entry.fate is Fate.DELIVERED:
        event["late_ms"] = max(0, entry.at_ms - entry.due_ms)
    if entry.by:
        event["by"] = entry.by
    if entry.reason:
        event["reason"] = entry.reason
    return event


class _JournalReader:
    """One consumer outside any group, assigned partition by partition."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.journal = config.topics.journal
        self.consumer = Consumer({**read_back_settings(config), "log_level": 0})
        self._partitions: int | None = None

    def close(self) -> None:
        self.consumer.close()

    def delay_record(
        self, shard: Shard, offset: int
    ) -> tuple[Scheduled | Cancel | None, int | None]:
        """The delay-topic record at ``offset`` (None when the log no longer holds it), and when
        it was produced."""
        msg = self._one(TopicPartition(shard.topic, shard.partition, offset))
        if msg is None or msg.offset() != offset:
            return None, None
        ts_type, ts = msg.timestamp()
        stamped = ts if ts_type != 0 else None
        try:
            record = parse_record(
                self.config.rules(),
                topic=shard.topic,
                partition=shard.partition,
                offset=offset,
                timestamp_ms=stamped,
                key=msg.key(),
                value=msg.value(),
                headers=headers_of(msg),
                now_ms=stamped or 0,
            )
        except Rejected:
            return None, stamped
        return record, stamped

    def search(
        self,
        shard: Shard | None,
        offset: int,
        delay_id: str,
        record: Scheduled | Cancel | None,
        produced_ms: int | None,
        *,
        since_ms: int | None,
        now_ms: int,
        topic: str | None,
    ) -> list[tuple[Shard, Entry]]:
        """The journal's entries for the record, oldest first."""
        if not self.journal:
            raise BridgeError('no journal (topics.journal is ""): only waiting records are traced')
        count = self._count()
        if shard is None:  # a caller's delay-id and nothing else: every partition, from since
            start = since_ms if since_ms is not None else now_ms - DEFAULT_SINCE_MS
            found: list[tuple[Shard, Entry]] = []
            for partition in range(count):
                found += self._scan(partition, start, None, lambda s, e: e.delay_id == delay_id
                                    and (topic is None or s.topic == topic))  # fmt: skip
            return sorted(found, key=lambda se: se[1].at_ms)
        partition = partition_for(journal_key(shard.topic, shard.partition), count)

        def mine(s: Shard, e: Entry) -> bool:
            return s == shard and e.offset == offset

        due_ms = record.due_ms if isinstance(record, Scheduled) else None
        first = since_ms if since_ms is not None else (produced_ms or 0)
        if due_ms is None:
            return self._scan(partition, first, None, mine)
        split = max(first, due_ms - BEFORE_DUE_MS)
        late = self._scan(partition, split, None, mine)
        return late or self._scan(partition, first, split, mine)

    def _count(self) -> int:
        if self._partitions is None:
            try:
                meta = self.consumer.list_topics(self.journal, timeout=TIMEOUT_S)
            except KafkaException as exc:
                raise BridgeError(f"Kafka did not answer: {exc}") from None
            topic = meta.topics.get(self.journal)
            if topic is None or topic.error is not None or not topic.partitions:
                raise BridgeError(f"journal topic {self.journal}: unknown topic")
            self._partitions = len(topic.partitions)
        return self._partitions

    def _scan(
        self, partition: int, from_ms: int, until_ms: int | None, wanted: Any
    ) -> list[tuple[Shard, Entry]]:
        """The entries ``wanted`` (shard, entry) in the journal records of ``partition``
        written from ``from_ms`` on (until ``until_ms``, else to the end as it is now)."""
        found: list[tuple[Shard, Entry]] = []
        for msg in self._records(partition, from_ms, until_ms):
            batch = decode_entries(msg.value(), headers_of(msg))
            if batch is None:
                continue
            s = Shard(batch.topic, batch.partition)
            found += [(s, e) for e in batch.entries if wanted(s, e)]
        return found

    def _records(self, partition: int, from_ms: int, until_ms: int | None) -> Iterator[Message]:
        tp = TopicPartition(self.journal, partition)
        try:
            _, end = self.consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)
            start = self._offset_for(partition, from_ms, end)
            stop = end if until_ms is None else self._offset_for(partition, until_ms, end)
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        if start >= stop:
            return
        self.consumer.assign([TopicPartition(self.journal, partition, start)])
        try:
            position = start
            while position < stop:
                batch = self.consumer.consume(500, TIMEOUT_S)
                if not batch:
                    raise BridgeError(f"journal {self.journal}[{partition}]: no answer")
                for msg in batch:
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return  # the end, before ``stop`` (a gap: compaction, markers)
                        continue
                    position = (msg.offset() or 0) + 1
                    if position > stop:
                        return
                    yield msg
        finally:
            self.consumer.unassign()

    def _offset_for(self, partition: int, at_ms: int, end: int) -> int:
        found = self.consumer.offsets_for_times(
            [TopicPartition(self.journal, partition, max(0, at_ms))], timeout=TIMEOUT_S
        )[0].offset
        return end if found < 0 else found

    def _one(self, tp: TopicPartition) -> Message | None:
        try:
            self.consumer.assign([tp])
            for _ in range(3):
                for msg in self.consumer.consume(1, TIMEOUT_S / 3):
                    if msg.error() is None:
                        return msg
                    return None
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        finally:
            self.consumer.unassign()
        return None


def print_trace(traced: Traced, as_json: bool) -> None:
    """``trace``'s output: JSON, or a few lines for a person."""
    if as_json:
        print(json.dumps(traced.as_json(), indent=2))
        return
    print(f"delay-id  {traced.delay_id or '-'}")
    print(f"origin    {traced.origin or '-'}")
    print(f"fate      {traced.fate}")
    for event in traced.events:
        when = format_time_ms(event["at"]) if "at" in event else "-" * 24
        print(f"{when}  {event['event']:<13}  {_detail(event)}")


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
