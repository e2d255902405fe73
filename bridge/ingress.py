"""Ingress: consume the delay topics, store valid records in Redis, dead-letter the rest.

For each batch: parse → DLQ the invalid ones and wait for Kafka's acknowledgement → store the
valid ones (and the shard watermark) in Redis. If Redis or the DLQ fails, the consumer rewinds to
the batch's first offsets and pauses, so nothing is skipped.

Two positions per delay-topic partition:

* the **watermark** in Redis (highest offset handled), where a consumer resumes after a restart
  or a rebalance, so an ordinary restart re-reads nothing;
* the **committed offset** in Kafka, the lowest offset still pending in Redis (found by
  ``low.lua`` every second, on revocation and on close). Everything below it has been delivered.

If Redis loses a shard's state (data wiped, failover to an empty replica) the consumer notices —
the watermark is missing or went back while it still owns the shard — and re-reads the delay
topic from the committed offset (or from Redis's older watermark), rebuilding every pending
record. Records delivered since that offset are delivered again, with the same ``delay-id``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka import KafkaError as ClientError

from bridge.errors import BridgeError, KafkaError, StoreError
from bridge.health import Readiness
from bridge.kafka import produce
from bridge.message import (
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    dead_letter_headers,
    origin,
    parse,
    wire_headers,
)
from bridge.metrics import Metrics
from bridge.store import Bound, Lost, Shard, Store

logger = logging.getLogger(__name__)

DLQ_FLUSH_TIMEOUT_S = 30.0
COMMIT_INTERVAL_S = 1.0  # how often the lowest pending offsets are stored for the auto-commit
COMMITTED_TIMEOUT_S = 10.0
RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
TOPIC_CHECK_INTERVAL_S = 30.0  # how often the owned delay topics' ids are compared with Redis's


def coords(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed message, which always has all three."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def headers_of(msg: Message) -> Headers:
    """A consumed message's headers as a list (the client returns None for none)."""
    return cast(Headers, list(msg.headers() or []))


@dataclass
class _Batch:
    stored: dict[Shard, tuple[int, list[Scheduled]]] = field(default_factory=dict)
    rejected: list[tuple[Message, Rejected]] = field(default_factory=list)


class Ingress:
    """The delay-topic consumer loop. Owns the consumer and a DLQ producer."""

    def __init__(
        self,
        consumer: Consumer,
        dlq_producer: Producer,
        store: Store,
        rules: Rules,
        metrics: Metrics,
        *,
        topics: Sequence[str],
        batch_size: int,
        on_assign: Callable[[set[Shard]], None],
        on_revoke: Callable[[set[Shard]], None],
        on_stored: Callable[[int], None],
        topic_ids: Callable[[Sequence[str]], dict[str, str]] = lambda topics: {},
        readiness: Readiness | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.consumer = consumer
        self.dlq = dlq_producer
        self.store = store
        self.rules = rules
        self.metrics = metrics
        self.topics = list(topics)
        self.batch_size = batch_size
        self._on_assign_cb = on_assign
        self._on_revoke_cb = on_revoke
        self._on_stored = on_stored
        self._topic_ids = topic_ids
        self.readiness = readiness or Readiness()
        self._clock_ms = clock_ms
        self.assigned: set[Shard] = set()
        # The Redis watermark of each owned shard as last read or written by this process.
        self.marks: dict[Shard, int] = {}
        self._next_commit = 0.0
        self._next_topic_check = time.monotonic() + TOPIC_CHECK_INTERVAL_S
        self.joined = False
        self._paused_until = 0.0
        self._failures = 0
        self.last_loop = time.monotonic()

    # -------------------------------------------------------------- group membership

    def subscribe(self) -> None:
        """Join the consumer group on the delay topics."""
        self.consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        shards = [Shard(tp.topic, tp.partition) for tp in partitions]
        retired: set[Shard] = set()
        replaced: dict[Shard, Bound] = {}
        try:
            # Records in the earlier store layout become claimable first (lows() retries).
            self.store.upgrade(shards)
            replaced = self._bind(shards)
            marks = self.store.watermarks(shards)
            retired = self.store.retired(shards)
        except StoreError:
            logger.warning("redis unreachable at assignment; resuming from committed offsets")
            marks = {}
        # Redis knows what it holds: resume right after it, which skips re-reading records
        # already stored (or delivered) when the last commit was lost in a crash. A new
        # incarnation of the topic is read from its beginning.
        for tp, shard in zip(partitions, shards, strict=True):
            if shard in replaced:
                tp.offset = OFFSET_BEGINNING
            elif shard in marks:
                tp.offset = marks[shard] + 1
                self.marks[shard] = marks[shard]
        consumer.incremental_assign(partitions)
        self.assigned |= set(shards)
        self.joined = True
        if self._paused_until:
            consumer.pause(partitions)
        logger.info(
            "assigned %s",
            ", ".join(f"{s.topic}[{s.partition}]" for s in sorted(shards)),
            extra={"partitions": len(shards)},
        )
        self._on_assign_cb(set(shards) | retired)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._store_lows({Shard(tp.topic, tp.partition) for tp in partitions}, rebuild=False)
        self._commit()
        self._drop(partitions, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.joined = False
        self._drop(partitions, "lost")

    def _drop(self, partitions: list[TopicPartition], how: str) -> None:
        shards = {Shard(tp.topic, tp.partition) for tp in partitions}
        self.assigned -= shards
        for shard in shards:
            self.marks.pop(shard, None)
        logger.info(
            "%s %s",
            how,
            ", ".join(f"{s.topic}[{s.partition}]" for s in sorted(shards)),
            extra={"partitions": len(shards)},
        )
        self._on_revoke_cb(shards)

    def _commit(self) -> None:
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            # _NO_OFFSET: nothing stored since the last commit, which is fine.
            if exc.args[0].code() != -168:
                logger.warning("offset commit failed: %s", exc)

    # -------------------------------------------------------------- the loop

    def poll_once(self, timeout: float = 0.5) -> int:
        """Consume one batch and handle it; returns how many records it held."""
        self.last_loop = time.monotonic()
        if self.last_loop >= self._next_commit:
            self._next_commit = self.last_loop + COMMIT_INTERVAL_S
            self._store_lows(set(self.assigned))
        if self.last_loop >= self._next_topic_check:
            self._next_topic_check = self.last_loop + TOPIC_CHECK_INTERVAL_S
            self._check_incarnations()
        if self._paused_until:
            if time.monotonic() < self._paused_until:
                self._discard(self.consumer.consume(self.batch_size, min(timeout, 0.1)))
                return 0
            self._resume()
        messages = self._consume(timeout)
        if not messages:
            return 0
        messages = [m for m in messages if not self._is_error(m)]
        if not messages:
            return 0
        try:
            self._handle(messages)
        except BridgeError as exc:
            self._rewind_and_pause(messages, exc)
            return 0
        if self._failures:
            self._failures = 0
            self.readiness.ok("ingress")
            logger.info("ingress stores batches again")
        return len(messages)

    def _consume(self, timeout: float) -> list[Message]:
        # consume(n, timeout) waits for n messages or the timeout; poll returns on the first
        # one, and what else is already fetched follows without waiting: no added latency.
        first = self.consumer.poll(timeout)
        if first is None:
            return []
        return [first, *self.consumer.consume(self.batch_size - 1, 0)]

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll_once()

    def close(self) -> None:
        """Commit what is stored and leave the group."""
        self._store_lows(set(self.assigned), rebuild=False)
        self._commit()
        self.consumer.close()
        self.dlq.flush(DLQ_FLUSH_TIMEOUT_S)

    # -------------------------------------------------------------- a batch

    def _is_error(self, msg: Message) -> bool:
        error = msg.error()
        if error is None:
            return False
        if error.fatal():
            raise KafkaError(f"fatal consumer error: {error}")
        logger.warning("consumer: %s", error)
        return True

    def _handle(self, messages: list[Message]) -> None:
        messages = self._went_back(messages)
        batch = self._parse(messages)
        if batch.rejected:
            self._dead_letter(batch.rejected)
        if batch.stored:
            expected = {s: self.marks[s] for s in batch.stored if s in self.marks}
            added = self.store.add(batch.stored, expected)
            for shard in added.lost:
                del batch.stored[shard]  # refused whole: re-read after the rebuild
            for shard, (high, _) in batch.stored.items():
                self.marks[shard] = max(high, self.marks.get(shard, -1))
            if added.lost:
                self._rebuild(added.lost)
        counts: dict[str, int] = {}
        earliest: int | None = None
        for shard, (_, records) in batch.stored.items():
            counts[shard.topic] = counts.get(shard.topic, 0) + len(records)
            for rec in records:
                earliest = rec.due_ms if earliest is None else min(earliest, rec.due_ms)
        for topic, n in counts.items():
            self.metrics.ingested.labels(delay_topic=topic).inc(n)
        if earliest is not None:
            self._on_stored(earliest)

    def _parse(self, messages: list[Message]) -> _Batch:
        now_ms = self._clock_ms()
        batch = _Batch()
        for msg in messages:
            topic, partition, offset = coords(msg)
            shard = Shard(topic, partition)
            high, records = batch.stored.setdefault(shard, (offset, []))
            batch.stored[shard] = (max(high, offset), records)
            ts_type, ts = msg.timestamp()
            try:
                records.append(
                    parse(
                        self.rules,
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        timestamp_ms=ts if ts_type != 0 else None,
                        key=msg.key(),
                        value=msg.value(),
                        headers=headers_of(msg),
                        now_ms=now_ms,
                    )
                )
            except Rejected as rejection:
                batch.rejected.append((msg, rejection))
            except Exception as exc:  # a parser bug must not stop the partition on this record
                logger.exception("parsing %s failed", origin(topic, partition, offset))
                batch.rejected.append(
                    (msg, Rejected(Reason.BAD_HEADER, f"unparseable: {type(exc).__name__}: {exc}"))
                )
        return batch

    def _dead_letter(self, rejected: list[tuple[Message, Rejected]]) -> None:
        errors: list[str] = []

        def report(err: ClientError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err.str())

        for msg, rejection in rejected:
            where = origin(*coords(msg))
            logger.info("dead-lettering %s: %s", where, rejection, extra={"origin": where})
            headers = dead_letter_headers(
                headers_of(msg), rejection.reason, rejection.detail, where
            )
            self._produce(msg.key(), msg.value(), headers, report)
        remaining = self.dlq.flush(DLQ_FLUSH_TIMEOUT_S)
        if remaining or errors:
            self.metrics.dlq_errors.inc(len(errors) + remaining)
            detail = (f"DLQ produce to {self.rules.dead_letter} failed: "
                      f"{errors[0] if errors else f'{remaining} unacknowledged'}")  # fmt: skip
            self.readiness.fail("dlq-writes", detail)
            raise KafkaError(detail)
        self.readiness.ok("dlq-writes")
        for reason, n in Counter(rejection.reason for _, rejection in rejected).items():
            self.metrics.dead_lettered.labels(reason=reason.value).inc(n)

    def _produce(
        self,
        key: str | bytes | None,
        value: str | bytes | None,
        headers: Headers,
        report: Callable[[ClientError | None, Message], None],
    ) -> None:
        topic = self.rules.dead_letter
        try:
            produce(self.dlq, topic, value=value, key=key, headers=wire_headers(headers),
                    on_delivery=report)  # fmt: skip
        except KafkaException as exc:
            detail = f"DLQ produce to {topic} failed: {exc.args[0].str()}"
            self.metrics.dlq_errors.inc()
            self.readiness.fail("dlq-writes", detail)
            raise KafkaError(detail) from exc
        self.dlq.poll(0)

    # -------------------------------------------------------------- offsets and rebuilds

    def _store_lows(self, shards: set[Shard], *, rebuild: bool = True) -> None:
        """Store each shard's lowest pending offset for the next commit (auto or explicit)."""
        shards &= self.assigned
        if not shards:
            return
        try:
            lows = self.store.lows({s: self.marks.get(s) for s in sorted(shards)})
            if lows.offsets:
                self.consumer.store_offsets(
                    offsets=[
                        TopicPartition(s.topic, s.partition, o) for s, o in lows.offsets.items()
                    ]
                )
            if lows.lost and rebuild:
                self._rebuild(lows.lost)
        except StoreError as exc:
            self.metrics.redis_errors.labels(stage="ingress").inc()
            logger.warning("lowest pending offsets not read, commit skipped: %s", exc)
        except (KafkaException, KafkaError) as exc:
            logger.warning("storing offsets failed: %s", exc)

    def _rebuild(self, lost: dict[Shard, Lost]) -> None:
        """Re-read lost shards from a point Redis still covers, or from the committed offset."""
        where: dict[Shard, int] = {}
        missing = [s for s, loss in lost.items() if loss.watermark is None and s in self.assigned]
        if missing:
            try:
                committed = self.consumer.committed(
                    [TopicPartition(s.topic, s.partition) for s in missing], COMMITTED_TIMEOUT_S
                )
            except KafkaException as exc:
                raise KafkaError(f"reading committed offsets for a rebuild failed: {exc}") from exc
            for tp in committed:
                where[Shard(tp.topic, tp.partition)] = max(tp.offset, OFFSET_BEGINNING)
        for shard, loss in lost.items():
            if shard not in self.assigned:
                continue
            name = f"{shard.topic}[{shard.partition}]"
            had = self.marks.pop(shard, None)
            if loss.watermark is None:
                offset = where[shard]
                logger.error(
                    "redis lost the state of %s (watermark %s): rebuilding it from committed "
                    "offset %s; records delivered since then are delivered again",
                    name, had, offset if offset >= 0 else "earliest",
                )  # fmt: skip
            else:
                offset = loss.watermark + 1
                logger.error(
                    "redis lost writes to %s (watermark back from %s to %d): re-reading from %d",
                    name, had, loss.watermark, offset,
                )  # fmt: skip
                self.marks[shard] = loss.watermark
            self.consumer.seek(TopicPartition(shard.topic, shard.partition, offset))
            cause = "redis-lost-state" if loss.watermark is None else "redis-lost-writes"
            self.metrics.rebuilds.labels(delay_topic=shard.topic, cause=cause).inc()

    # -------------------------------------------------------------- topic incarnations

    def _bind(self, shards: Sequence[Shard], went_back: Sequence[Shard] = ()) -> dict[Shard, Bound]:
        """Bind shards to their topic's current id; returns the ones whose Redis state belonged
        to an earlier incarnation (or whose offsets went back) and was retired. Their waiting
        records move to a retired shard the mover drains; the caller reads them from the log's
        beginning."""
        ids = self._topic_ids(sorted({s.topic for s in shards}))
        bind = {s: ids.get(s.topic, "") for s in shards if s.topic in ids or s in went_back}
        if not bind:
            return {}
        replaced = {s: b for s, b in self.store.bind(bind, went_back).items() if b.replaced}
        for shard, bound in replaced.items():
            topic_id = ids.get(shard.topic, "")
            if bound.stored_id and topic_id and bound.stored_id != topic_id:
                cause = "topic-recreated"
                what = f"was deleted and created again (topic id {bound.stored_id} -> {topic_id})"
            else:
                cause = "offsets-went-back"
                what = (
                    f"went back: its log holds offsets Redis had already handled (watermark "
                    f"{bound.watermark}); the log was truncated, restored or replaced"
                )
            logger.error(
                "delay topic %s %s: reading it again from its beginning; the %d records Redis "
                "held from before are still delivered, records delivered before may be "
                "delivered again", shard, what, bound.records,
            )  # fmt: skip
            self.metrics.rebuilds.labels(delay_topic=shard.topic, cause=cause).inc()
            self.marks.pop(shard, None)
        return replaced

    def _went_back(self, messages: list[Message]) -> list[Message]:
        """Messages at or below a shard's watermark mean its offsets went back (the topic was
        recreated, or its log truncated): retire the shard's state and read it from the start.
        Returns the messages of the other shards."""
        back: set[Shard] = set()
        for msg in messages:
            topic, partition, offset = coords(msg)
            mark = self.marks.get(Shard(topic, partition))
            if mark is not None and offset <= mark:
                back.add(Shard(topic, partition))
        if not back:
            return messages
        self._restart(self._bind(sorted(back), sorted(back)))
        return [m for m in messages if Shard(*coords(m)[:2]) not in back]

    def _check_incarnations(self) -> None:
        """A topic deleted and created again while the bridge runs (see :meth:`_bind`)."""
        try:
            self._restart(self._bind(sorted(self.assigned)))
        except StoreError as exc:
            logger.warning("delay topic incarnations not checked: %s", exc)

    def _restart(self, replaced: dict[Shard, Bound]) -> None:
        for shard in replaced:
            self.consumer.seek(TopicPartition(shard.topic, shard.partition, OFFSET_BEGINNING))
        retired = {b.retired for b in replaced.values() if b.retired is not None}
        if retired:
            self._on_assign_cb(retired)

    # -------------------------------------------------------------- failure handling

    def _rewind_and_pause(self, messages: list[Message], exc: BridgeError) -> None:
        backoff = RETRY_BACKOFF_S[min(self._failures, len(RETRY_BACKOFF_S) - 1)]
        self._failures += 1
        if isinstance(exc, StoreError):
            self.metrics.redis_errors.labels(stage="ingress").inc()
        self.readiness.fail("ingress", f"ingress cannot store records: {exc}")
        logger.error("batch not stored, retrying in %.1fs: %s", backoff, exc)
        self._rewind(messages)
        self._pause(backoff)

    def _rewind(self, messages: Sequence[Message]) -> None:
        first: dict[Shard, int] = {}
        for msg in messages:
            topic, partition, offset = coords(msg)
            shard = Shard(topic, partition)
            first[shard] = min(first.get(shard, offset), offset)
        for shard, offset in first.items():
            if shard in self.assigned:
                self.consumer.seek(TopicPartition(shard.topic, shard.partition, offset))

    def _pause(self, seconds: float) -> None:
        self._paused_until = time.monotonic() + seconds
        self.consumer.pause(self._assignment())

    def _resume(self) -> None:
        self._paused_until = 0.0
        self.consumer.resume(self._assignment())

    def _assignment(self) -> list[TopicPartition]:
        return [TopicPartition(s.topic, s.partition) for s in self.assigned]

    def _discard(self, messages: Sequence[Message]) -> None:
        """Messages fetched before a pause took effect are re-read after resuming."""
        valid = [m for m in messages if m.error() is None]
        if valid:
            self._rewind(valid)
