"""Reads the journal back: the entries of one delay-topic partition, located by time.

A partition's entries are on one journal partition (the one a producer with murmur2 puts the key
``<topic>:<partition>`` on), written in order; Kafka's offsets-for-times says where to start
reading for a given time, so no read starts at the journal's beginning unless asked to. Used by
``trace`` and by the rebuilds (:meth:`JournalReader.fates`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from bridge.client import partition_for
from bridge.config import Config, admin_settings, read_back_settings
from bridge.dialects import parse_message
from bridge.errors import BridgeError, UsageError
from bridge.journal.entries import Entry, decode_entries, journal_key, may_hold, offset_needles
from bridge.kafka import headers_of
from bridge.message import Cancel, Rejected, Scheduled, cut
from bridge.store import Shard

TIMEOUT_S = 10.0
POLL_S = 0.05
# Producers stamp records with their own clocks: entries of records at or after an offset are read
# from this long before that record's timestamp.
CLOCK_SLACK_MS = 60_000

# What a client kept across a leader change or a broker restart is told while its cached leaders
# or their epochs are stale: asked again once its metadata is refreshed, it is answered.
STALE_LEADERS = frozenset(
    {
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._NOENT,
    }
)

Wanted = Callable[[Shard, Entry], bool]
T = TypeVar("T")


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
        """Learn the journal's partitions and connect to their leaders (a request each), and
        the admin client that asks for their ends too: a new client's first request also looks
        the leaders up, which on a busy machine outlasts a take-over's wait."""
        partitions = range(self.partitions())
        try:
            for partition in partitions:
                self.consumer.get_watermark_offsets(
                    TopicPartition(self.journal, partition), self.timeout_s, cached=False
                )
            self._ends(partitions)
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

    def delay_end(self, shard: Shard) -> int:
        """The next offset ``shard``'s delay-topic partition will hold; a UsageError when its
        topic has no such partition (no record can be there)."""
        try:
            meta = self.consumer.list_topics(shard.topic, timeout=self.timeout_s)
            topic = meta.topics.get(shard.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                raise UsageError(f"{cut(shard.topic)}: no such topic")
            if shard.partition not in topic.partitions:
                raise UsageError(
                    f"{cut(shard.topic)} has {len(topic.partitions)} partitions: "
                    f"no record is in partition {shard.partition}"
                )
            tp = TopicPartition(shard.topic, shard.partition)
            high = self.consumer.get_watermark_offsets(tp, self.timeout_s, cached=False)[1]
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        return int(high)

    def fates(
        self,
        shard: Shard,
        start: int,
        topic_id: str = "",
        *,
        since_ms: int | None = None,
        at_end: bool = False,
    ) -> list[Entry]:
        """The entries of ``shard``'s records written since the record at ``start`` was produced,
        or since ``since_ms`` when that is earlier (when Redis last acknowledged a record of the
        shard); ``at_end``: no record is at ``start`` yet, ``since_ms`` alone says. Those from
        ``start`` on are what a re-read from there must not schedule again; those before, what a
        rollback of Redis may have put back (see bridge.ingress.settled). With ``topic_id``,
        entries written for another incarnation of the topic are left out."""
        stamped = None if at_end else self.delay_record(shard, start)[1]
        known = [t for t in (stamped, since_ms) if t is not None]
        from_ms = min(known) - CLOCK_SLACK_MS if known else 0
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
        at = (shard.topic, shard.partition, offset)
        try:
            record = parse_message(self.config.rules(), at, msg, stamped or 0)
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
        for msg in self._records({partition: (from_ms, until_ms)}):
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

    def scan_shards(
        self, reads: Mapping[Shard, tuple[int, Collection[int]]], topic_ids: Mapping[Shard, str]
    ) -> dict[Shard, list[Entry]]:
        """Each shard's entries for the offsets it names, among the journal records written for
        it from its time (ms) on — from the earliest time of the shards on its journal partition —
        to the end as it is now, written for the shard's incarnation of its topic (its id in
        ``topic_ids``, if known: a retired shard's is the earlier incarnation's). The journal
        partitions they are on are read side by side: one request of each kind for them all, not
        one after another; a record holding none of a shard's offsets is passed over undecoded."""
        # A partition's live shard and its retired ones share a key: their topic ids tell apart.
        owners: dict[bytes, list[Shard]] = {}
        for s in reads:
            owners.setdefault(journal_key(s.topic, s.partition), []).append(s)
        needles = {s: offset_needles(offsets) for s, (_, offsets) in reads.items()}
        spans: dict[int, tuple[int, int | None]] = {}
        for shard, (from_ms, _) in reads.items():
            partition = self.partition_of(shard)
            earliest = spans.get(partition, (from_ms, None))[0]
            spans[partition] = (min(from_ms, earliest), None)
        found: dict[Shard, list[Entry]] = {s: [] for s in reads}
        for msg in self._records(spans):
            group, value = owners.get(msg.key() or b""), msg.value()
            if group is None or value is None:
                continue
            batch, decoded = None, False  # decoded once, for the first owner it may hold
            for owner in group:
                if not may_hold(value, needles[owner]):
                    continue
                if not decoded:
                    batch, decoded = decode_entries(value, headers_of(msg)), True
                topic_id = topic_ids.get(owner, "")
                if batch is None or (topic_id and batch.topic_id not in ("", topic_id)):
                    continue
                offsets = reads[owner][1]
                found[owner] += [e for e in batch.entries if e.offset in offsets]
        return found

    def _records(self, spans: Mapping[int, tuple[int, int | None]]) -> Iterator[Message]:
        """The journal records of each partition written from the first time (ms) of its span
        until the second (None: to the end as it is now), the partitions read side by side."""
        try:
            ends = self._asked(lambda: self._ends(list(spans)))
            sinces = {p: since for p, (since, _) in spans.items()}
            starts = self._asked(lambda: self._offsets_for(sinces, ends))
            untils = {p: until for p, (_, until) in spans.items() if until is not None}
            stops = {**ends, **self._asked(lambda: self._offsets_for(untils, ends))}
        except KafkaException as exc:
            raise BridgeError(f"Kafka did not answer: {exc}") from None
        positions = {p: start for p, start in starts.items() if start < stops[p]}
        if not positions:
            return
        self.consumer.assign([TopicPartition(self.journal, p, o) for p, o in positions.items()])
        try:
            answered = time.monotonic()
            while any(positions[p] < stops[p] for p in positions):
                # consume() returns when it has them all or at its timeout: a short one, so the
                # last batch short of 500 is not held for the whole wait.
                for msg in self.consumer.consume(500, POLL_S):
                    partition, error = msg.partition() or 0, msg.error()
                    at = (msg.offset() or 0) + (0 if error is not None else 1)
                    if partition not in positions:
                        continue
                    if at > positions[partition]:
                        positions[partition], answered = at, time.monotonic()
                    # An error: the end as read_committed sees it, short of the stop while a
                    # transaction before it is open; its records come once it commits.
                    if error is None and at <= stops[partition]:
                        yield msg
                if time.monotonic() - answered > self.timeout_s:
                    late = sorted(p for p in positions if positions[p] < stops[p])
                    raise BridgeError(f"journal {self.journal}{late}: no answer")
        finally:
            self.consumer.unassign()

    def _asked(self, ask: Callable[[], T]) -> T:
        """``ask()``, asked again for up to the reader's timeout while Kafka answers that the
        clients' leaders are stale (STALE_LEADERS), their metadata refreshed before each time:
        after a broker restart the admin client's requests carry the leader epochs it cached
        before and are refused until it asks for the topic's metadata again."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return ask()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                stale = isinstance(error, KafkaError) and error.code() in STALE_LEADERS
                if not stale or time.monotonic() > deadline:
                    raise
            for client in (self.consumer, self._admin):
                if client is not None:
                    client.list_topics(self.journal, timeout=max(0.1, deadline - time.monotonic()))
            time.sleep(POLL_S)

    def _ends(self, partitions: Iterable[int]) -> dict[int, int]:
        """The partitions' ends, records of open transactions included (the consumer reads only
        what is committed: the read ends once they are committed or aborted)."""
        if self._admin is None:
            self._admin = AdminClient({**admin_settings(self.config), "log_level": 0})
        tps = {p: TopicPartition(self.journal, p) for p in partitions}
        answer = self._admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps.values()},  # type: ignore[no-untyped-call]
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self.timeout_s,
        )
        return {p: int(answer[tp].result().offset) for p, tp in tps.items()}

    def _offsets_for(self, times: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
        """Each partition's first offset written at or after its time (ms), else its end."""
        if not times:
            return {}
        found = self.consumer.offsets_for_times(
            [TopicPartition(self.journal, p, max(0, ms)) for p, ms in times.items()],
            timeout=self.timeout_s,
        )
        return {tp.partition: ends[tp.partition] if tp.offset < 0 else tp.offset for tp in found}

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
