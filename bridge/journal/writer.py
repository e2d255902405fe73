"""Writes the journal: a batch of one delay-topic partition's fates per Kafka record.

Delivery does not wait for the journal (at-least-once mode): an entry Kafka refuses is counted in
``delay_bridge_journal_failures_total`` and named in /readyz, and the records go on being
delivered. What such an outage costs is what the journal would have given: ``trace`` does not know
those fates, and a Redis rebuild meanwhile delivers those records again (docs/journal.md).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.health import Readiness
from bridge.journal.entries import Entry, encode_entries, withdrawn_entry
from bridge.kafka import produce
from bridge.message import origin
from bridge.metrics import Metrics
from bridge.store import Shard, Withdrawn

logger = logging.getLogger(__name__)

# While Kafka refuses entries, an empty batch is written this often, traffic or not: /readyz
# turns green once one is taken (a batch without entries tells a reader nothing).
TRY_AGAIN_S = 5.0
# A journal record's value at most: the entries of a batch or a transaction that settles more go
# in several records, each under the journal topic's max.message.bytes and the producer's
# message.max.bytes (both 1 MB by default) — 2,000 records with 64-byte ids made one of 1.1 MB.
RECORD_BYTES = 256 * 1024


class Journal:
    """The journal topic, written through a stage's own producer: its delivery reports are
    served wherever that producer is polled."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        metrics: Metrics,
        readiness: Readiness,
        topic_ids: Callable[[], Mapping[str, str]] = dict,
    ):
        self.producer = producer
        self.topic = topic
        self.metrics = metrics
        self.readiness = readiness
        self._topic_ids = topic_ids  # the delay topics' ids as last heard, without asking Kafka
        self._failing = False
        self._last: Shard | None = None  # the shard of the last batch written
        self._next_try = 0.0
        readiness.try_with(self.try_again)

    def write(
        self,
        shard: Shard,
        entries: list[Entry] | list[str],
        producer: Producer | None = None,
        topic_id: str = "",
    ) -> None:
        """Journal the fates of records of ``shard`` (a Kafka record per RECORD_BYTES of them),
        through ``producer`` if given (a shard's transactional producer: the entries commit with
        the records, and a record Kafka refuses at once raises KafkaException: the transaction
        must not commit without it). ``topic_id``: the incarnation of the topic they belong to
        (Claimed.topic_id), else the one last heard."""
        if not entries:
            return
        self._last = shard
        self._send(shard, entries, producer, topic_id)

    def delivered(
        self,
        shard: Shard,
        fates: Iterable[tuple[str, str]],
        producer: Producer | None = None,
    ) -> None:
        """Journal the fates of records claimed from ``shard``, each with the topic id of the
        incarnation it belongs to: a batch per incarnation (one, unless the topic was recreated
        while they were in flight)."""
        by_id: dict[str, list[str]] = {}
        for topic_id, entry in fates:
            entries = by_id.get(topic_id)
            if entries is None:
                entries = by_id[topic_id] = []
            entries.append(entry)
        for topic_id, entries in by_id.items():
            self.write(shard, entries, producer, topic_id)

    def try_again(self) -> None:
        """While entries are refused, write an empty batch every TRY_AGAIN_S (see there)."""
        shard = self._last
        if not self._failing or shard is None or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + TRY_AGAIN_S
        self._send(shard, [], None)

    def _send(
        self,
        shard: Shard,
        entries: list[Entry] | list[str],
        producer: Producer | None,
        topic_id: str = "",
    ) -> None:
        topic_id = topic_id or self._topic_ids().get(shard.topic, "")
        key, value, headers = encode_entries(shard.topic, shard.partition, entries, topic_id)
        if len(value) > RECORD_BYTES and len(entries) > 1:
            half = len(entries) // 2
            self._send(shard, entries[:half], producer, topic_id)
            self._send(shard, entries[half:], producer, topic_id)
            return
        self.metrics.journal_pending.inc(len(entries))
        try:
            produce(
                producer or self.producer,
                self.topic,
                key=key,
                value=value,
                headers=headers,
                on_delivery=functools.partial(self._written, len(entries)),
            )
        except KafkaException as exc:  # refused locally (too large for message.max.bytes)
            self._written(len(entries), exc.args[0], None)
            if producer is not None:
                raise

    def withdrawn(self, records: Sequence[Withdrawn], at_ms: int) -> None:
        """Journal what cancels and replacements withdrew, by the shard each record was in."""
        by_shard: dict[Shard, list[str]] = {}
        origins: dict[tuple[Shard, int], str] = {}  # a record of cancels withdraws many
        for w in records:
            by = origins.get((w.by, w.by_offset))
            if by is None:
                by = origins[w.by, w.by_offset] = origin(w.by.topic, w.by.partition, w.by_offset)
            entry = withdrawn_entry(w, at_ms, by)
            by_shard.setdefault(w.shard, []).append(entry)
        for shard, entries in by_shard.items():
            self.write(shard, entries)

    def _written(self, count: int, err: KafkaError | None, _msg: Message | None) -> None:
        self.metrics.journal_pending.dec(count)
        if err is None:
            self.metrics.journal_written.inc(count)
            if self._failing:
                self._failing = False
                self.readiness.ok("journal-writes")
                logger.info("the journal %s takes entries again", self.topic)
            return
        self.metrics.journal_failures.inc(count)
        if not count:
            return  # an empty batch tried again: the check stays as the last refusal set it
        detail = f"journal {self.topic} refused {count} entries: {err.str()}"
        if not self._failing:
            self._failing = True
            logger.error("%s; delivery goes on without them", detail)
        self.readiness.fail("journal-writes", detail)
