"""Reads the journal back: the entries of one delay-topic partition, located by time.

A partition's entries are on one journal partition (the one a producer with murmur2 puts the key
``<topic>:<partition>`` on), written in order; Kafka's offsets-for-times says where to start
reading for a given time, so no read starts at the journal's beginning unless asked to. Used by
``trace`` and by the rebuilds (:meth:`JournalReader.fates`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from bridge.client import partition_for
from bridge.config import Config, admin_settings, read_back_settings
from bridge.dialects import parse_record
from bridge.errors import BridgeError
from bridge.journal.entries import Entry, decode_entries, journal_key
from bridge.kafka import headers_of
from bridge.message import Cancel, Rejected, Scheduled
from bridge.store import Shard

TIMEOUT_S = 10.0
POLL_S = 0.05
# Producers stamp records with their own clocks: entries of records at or after an offset are read
# from this long before that record's timestamp.
CLOCK_SLACK_MS = 60_000

Wanted = Callable[[Shard, Entry], bool]


@dataclass(frozen=True)
class Sought:
    """What a scan looks for, to skip journal records without decoding them: those of another
    ``shard``; those whose value lacks ``needle`` (bytes every wanted entry's JSON holds, see
    :func:`field_bytes`); everything after the first record with a wanted entry (``first``); and,
    once decoded, those written for another incarnation of the topic than ``topic_id``."""

    shard: Shard | None = None
    needle: bytes = b""
    first: bool = False
    topic_id: str = ""  # records written for another incarnation (another known id) are skipped


class JournalReader:
    """One consumer outside any group, assigned a partition at a time."""

    def __init__(self, config: Config, timeout_s: float = TIMEOUT_S) -> None:
        self.config = config
        self.timeout_s = timeout_s  # each request's wait for Kafka
        self.journal = config.topics.journal
        self.consumer = Consumer({**read_back_settings(config), "log_level": 0})
        self._admin: AdminClient | None = None
        self._partitions: int | None = None

    def close(self) -> None:
        self.consumer.close()

    def refresh(self) -> None:
        """Ask for the journal's partition count again at its next use: for a reader kept between
        reads, the topic may have gained partitions, and a shard's entries moved with them."""
        self._partitions = None

    def warm(self) -> None:
        """Learn the journal's partitions and connect to their leaders (a request each)."""
        for partition in range(self.partitions()):
            try:
                self.consumer.get_watermark_offsets(
                    TopicPartition(self.journal, partition), self.timeout_s, cached=False
                )
            except KafkaException as exc:
                raise BridgeError(f"Kafka did not answer: {exc}") from None

    def partition_of(self, shard: Shard) -> int:
        """The journal partition of ``shard``'s entries."""
        return partition_for(journal_key(shard.topic, shard.partition), self.partitions())

    def partitions(self) -> int:
        """How many partitions the journal topic has."""
        if self._partitions is None:
            try:
                meta = self.consumer.list_topics(self.journal, timeout=self.timeout_s)
            except KafkaException as exc:
                raise BridgeError(f"Kafka did not answer: {exc}") from None
            topic = meta.topics.get(self.journal)
            if topic is None or topic.error is not None or not topic.partitions:
                raise BridgeError(f"journal topic {self.journal}: unknown topic")
            self._partitions = len(topic.partitions)
        return self._partitions

    def fates(self, shard: Shard, start: int, topic_id: str = "") -> list[Entry]:
        """The entries of ``shard``'s records written since the record at ``start`` was produced:
        those from ``start`` on are what a re-read from there must not schedule again; those
        before, what a rollback of Redis may have put back (see bridge.ingress.settled). With
        ``topic_id``, entries written for another incarnation of the topic are left out."""
        _, stamped = self.delay_record(shard, start)
        from_ms = 0 if stamped is None else stamped - CLOCK_SLACK_MS
        found = self.scan(
            self.partition_of(shard),
            from_ms,
            None,
            lambda s, e: True,
            Sought(shard, topic_id=topic_id),
        )
        return [e for _, e in found]

    def delay_record(
        self, shard: Shard, offset: int
    ) -> tuple[Scheduled | Cancel | None, int | None]:
        """The delay-topic record at ``offset`` (None when the log no longer holds it, or it is
        not one the rules take), and when it was produced."""
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

    def scan(
        self,
        partition: int,
        from_ms: int,
        until_ms: int | None,
        wanted: Wanted,
        sought: Sought | None = None,
    ) -> list[tuple[Shard, Entry]]:
        """The entries ``wanted`` (shard, entry) in the journal records of ``partition``
        written from ``from_ms`` on (until ``until_ms``, else to the end as it is now), narrowed
        to what ``sought`` names: the records decoded are only those that may hold it."""
        sought = sought or Sought()
        key = (
            None
            if sought.shard is None
            else journal_key(sought.shard.topic, sought.shard.partition)
        )
        found: list[tuple[Shard, Entry]] = []
        for msg in self._records(partition, from_ms, until_ms):
            value = msg.value()
            if key is not None and msg.key() != key:
                continue
            if value is None or (sought.needle and sought.needle not in value):
                continue
            batch = decode_entries(value, headers_of(msg))
            if batch is None or (sought.topic_id and batch.topic_id not in ("", sought.topic_id)):
                continue
            s = Shard(batch.topic, batch.partition)
            found += [(s, e) for e in batch.entries if wanted(s, e)]
            if found and sought.first:
                break
        return found

    def _records(self, partition: int, from_ms: int, until_ms: int | None) -> Iterator[Message]:
        tp = TopicPartition(self.journal, partition)
        try:
            end = self._end(tp)
            start = self._offset_for(partition, from_ms, end)
            stop = end if until_ms is None else self._offset_for(partition, until_ms, end)
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        if start >= stop:
            return
        self.consumer.assign([TopicPartition(self.journal, partition, start)])
        try:
            position, answered = start, time.monotonic()
            while position < stop:
                # consume() returns when it has them all or at its timeout: a short one, so the
                # last batch short of 500 is not held for the whole wait.
                for msg in self.consumer.consume(500, POLL_S):
                    error = msg.error()
                    at = (msg.offset() or 0) + (0 if error is not None else 1)
                    if at > position:
                        position, answered = at, time.monotonic()
                    if error is not None:
                        # The end as read_committed sees it: short of ``stop`` while a
                        # transaction before it is open; its records come once it commits.
                        continue
                    if position > stop:
                        return
                    yield msg
                if time.monotonic() - answered > self.timeout_s:
                    raise BridgeError(f"journal {self.journal}[{partition}]: no answer")
        finally:
            self.consumer.unassign()

    def _end(self, tp: TopicPartition) -> int:
        """The partition's end, records of open transactions included (the consumer reads only
        what is committed: the read ends once they are committed or aborted)."""
        if self._admin is None:
            self._admin = AdminClient({**admin_settings(self.config), "log_level": 0})
        answer = self._admin.list_offsets(
            {tp: OffsetSpec.latest()},  # type: ignore[no-untyped-call]
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self.timeout_s,
        )
        return int(answer[tp].result().offset)

    def _offset_for(self, partition: int, at_ms: int, end: int) -> int:
        found = self.consumer.offsets_for_times(
            [TopicPartition(self.journal, partition, max(0, at_ms))], timeout=self.timeout_s
        )[0].offset
        return end if found < 0 else found

    def _one(self, tp: TopicPartition) -> Message | None:
        try:
            self.consumer.assign([tp])
            for _ in range(3):
                for msg in self.consumer.consume(1, self.timeout_s / 3):
                    return msg if msg.error() is None else None
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        finally:
            self.consumer.unassign()
        return None
