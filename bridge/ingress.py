"""Ingress: consume the delay topics, store valid records in Redis, dead-letter the rest.

For each batch: parse → DLQ the invalid ones and wait for Kafka's acknowledgement → store the
valid ones (and the shard watermark) in Redis. If Redis or the DLQ fails, the consumer rewinds to
the batch's first offsets and pauses, so nothing is skipped.

Where each partition resumes — the Redis watermark, the committed lowest pending offset — and
the rebuilds when Redis or the delay topic no longer matches them are :mod:`bridge.positions`'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
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

from bridge.catchup import CatchUp
from bridge.dialects import parse_record
from bridge.errors import BridgeError, KafkaError, StoreError, WriteRefused
from bridge.health import Readiness
from bridge.kafka import produce
from bridge.message import (
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    dead_letter_headers,
    origin,
    wire_headers,
)
from bridge.metrics import Metrics
from bridge.positions import Positions
from bridge.store import Bound, Shard, Store

logger = logging.getLogger(__name__)

DLQ_FLUSH_TIMEOUT_S = 30.0
WATERMARK_TIMEOUT_S = 5.0  # reading a partition's end offset, when it is read again
COMMIT_INTERVAL_S = 1.0  # how often the lowest pending offsets are stored for the auto-commit
RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
HOLD_SLICE_S = 0.01  # how often a hold looks at what came in when linger is 0
TOPIC_CHECK_INTERVAL_S = 30.0  # how often the owned delay topics' ids are compared with Redis's


def coords(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed message, which always has all three."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def shard_of(msg: Message) -> Shard:
    """The delay-topic partition a consumed message came from."""
    topic, partition, _ = coords(msg)
    return Shard(topic, partition)


def headers_of(msg: Message) -> Headers:
    """A consumed message's headers as a list (the client returns None for none)."""
    return cast(Headers, list(msg.headers() or []))


@dataclass
class _Batch:
    """What was read of each partition: the highest offset and the records to store (accepted
    ones and cancels), the lowest offset and the newest record timestamp; and the records
    rejected. Kept per partition, so a batch's bookkeeping is not per record."""

    stored: dict[Shard, tuple[int, list[Scheduled | Cancel]]] = field(default_factory=dict)
    rejected: list[tuple[Message, Rejected]] = field(default_factory=list)
    low: dict[Shard, int] = field(default_factory=dict)
    newest_ms: dict[Shard, int] = field(default_factory=dict)

    def merge(self, later: _Batch) -> None:
        """Add a batch consumed after this one (offsets only grow within a partition)."""
        for shard, (high, records) in later.stored.items():
            mine = self.stored.get(shard)
            if mine is None:
                self.stored[shard] = (high, records)
            else:  # extended in place: a hold merges a linger's worth at a time
                mine[1].extend(records)
                self.stored[shard] = (max(mine[0], high), mine[1])
        for shard, low in later.low.items():
            self.low[shard] = min(low, self.low.get(shard, low))
        for shard, ts in later.newest_ms.items():
            self.newest_ms[shard] = max(ts, self.newest_ms.get(shard, ts))
        self.rejected += later.rejected

    def drop(self, shards: set[Shard]) -> None:
        """Leave out what was read of ``shards`` (read again, or by their next owner)."""
        for shard in shards:
            self.stored.pop(shard, None)
            self.low.pop(shard, None)
            self.newest_ms.pop(shard, None)
        self.rejected = [(m, r) for m, r in self.rejected if shard_of(m) not in shards]


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
        linger_ms: int = 0,
        hold_ms: int = 0,
        on_assign: Callable[[set[Shard]], None],
        on_revoke: Callable[[set[Shard]], None],
        on_stored: Callable[[Mapping[Shard, int]], None],
        topic_ids: Callable[[Sequence[str]], dict[str, str]] = lambda topics: {},
        known_ids: Callable[[], Mapping[str, str]] = dict,
        readiness: Readiness | None = None,
        catch_up: CatchUp | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.consumer = consumer
        self.catch_up = catch_up or CatchUp()
        self.dlq = dlq_producer
        self.store = store
        self.rules = rules
        self.metrics = metrics
        self.topics = list(topics)
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.hold_ms = hold_ms
        self._last_batch = 0.0  # monotonic s: when the last batch was consumed
        self._on_assign_cb = on_assign
        self._on_revoke_cb = on_revoke
        self._on_stored = on_stored
        self.readiness = readiness or Readiness()
        self.positions = Positions(
            consumer, store, metrics, topic_ids, on_retired=on_assign, known_ids=known_ids,
            on_reread=self._reading_again,
        )  # fmt: skip
        self._clock_ms = clock_ms
        self._next_commit = 0.0
        self._next_topic_check = time.monotonic() + TOPIC_CHECK_INTERVAL_S
        self.joined = False
        # Partitions lost with the group session (Kafka unreachable), until the group forms
        # again: nobody else can own them meanwhile, so their backlog is still this replica's
        # to report (bridge.metrics.Sampler).
        self.lost: frozenset[Shard] = frozenset()
        self._paused_until = 0.0
        self._failures = 0
        self.last_loop = time.monotonic()

    @property
    def assigned(self) -> set[Shard]:
        """The delay-topic partitions this replica owns."""
        return self.positions.assigned

    @property
    def marks(self) -> dict[Shard, int]:
        """The watermark of each owned shard as last read or written by this process."""
        return self.positions.marks

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
            # Keys under the names of earlier builds move first; records in the earlier store
            # layout then become claimable (lows() retries that).
            self.store.relocate(shards)
            self.store.upgrade(shards)
            replaced = self.positions.bind(shards)
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
        self._reading_again({s: tp.offset for s, tp in zip(shards, partitions, strict=True)})
        self.assigned.update(shards)
        self.lost = frozenset()  # the group formed again: what is not ours now is another's
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
        self.positions.store_lows(
            {Shard(tp.topic, tp.partition) for tp in partitions}, rebuild=False
        )
        self._commit()
        self._drop(partitions, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.joined = False
        self.lost = self.lost | {Shard(tp.topic, tp.partition) for tp in partitions}
        self._drop(partitions, "lost")

    def _drop(self, partitions: list[TopicPartition], how: str) -> None:
        shards = {Shard(tp.topic, tp.partition) for tp in partitions}
        self.assigned.difference_update(shards)
        for shard in shards:
            self.marks.pop(shard, None)
            self.catch_up.stop(shard)
        logger.info(
            "%s %s",
            how,
            ", ".join(f"{s.topic}[{s.partition}]" for s in sorted(shards)),
            extra={"partitions": len(shards)},
        )
        self._on_revoke_cb(shards)

    def _reading_again(self, starts: Mapping[Shard, int]) -> None:
        """The consumer reads these shards from these offsets (negative: the committed offset or
        the beginning): hold their due records until it reaches where each partition ends now
        (see bridge.catchup). Without the end offset the shard is not held: said once, the
        records flow as they would have before."""
        starts = dict(starts)
        unknown = [s for s, offset in starts.items() if offset < 0 and offset != OFFSET_BEGINNING]
        if unknown:  # from the committed offsets: one request for all of them
            try:
                committed = self.consumer.committed(
                    [TopicPartition(s.topic, s.partition) for s in unknown], WATERMARK_TIMEOUT_S
                )
                starts.update({Shard(tp.topic, tp.partition): tp.offset for tp in committed})
            except KafkaException as exc:
                logger.warning("committed offsets not read, not holding records while catching "
                               "up: %s", exc)  # fmt: skip
                starts = {s: o for s, o in starts.items() if s not in unknown}
        for shard, start in starts.items():
            tp = TopicPartition(shard.topic, shard.partition)
            try:
                low, end = self.consumer.get_watermark_offsets(tp, WATERMARK_TIMEOUT_S,
                                                               cached=False)  # fmt: skip
            except KafkaException as exc:
                logger.warning("end offset of %s[%d] not read, not holding its records while "
                               "catching up: %s", shard.topic, shard.partition, exc)  # fmt: skip
                continue
            self.catch_up.start(shard, start if start >= 0 else low, end)

    def _caught_up(self) -> None:
        """Release the shards whose read position reached the end they were held to."""
        ends = self.catch_up.ends()
        if not ends:
            return
        tps = [TopicPartition(s.topic, s.partition) for s in ends]
        for tp in self.consumer.position(tps):
            self.catch_up.reached(Shard(tp.topic, tp.partition), tp.offset)

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
            self.positions.store_lows(set(self.assigned))
        if self.last_loop >= self._next_topic_check:
            self._next_topic_check = self.last_loop + TOPIC_CHECK_INTERVAL_S
            self.positions.check_incarnations()
        if self._paused_until:
            if time.monotonic() < self._paused_until:
                self._discard(self.consumer.consume(self.batch_size, min(timeout, 0.1)))
                return 0
            self._resume()
        messages = self._consume(timeout)
        if not messages:
            self._caught_up()
            return 0
        messages = [m for m in messages if not self._is_error(m)]
        if not messages:
            return 0
        batch = self._parse(messages)
        if self.hold_ms:
            messages, batch = self._hold(messages, batch)
        try:
            self._handle(messages, batch)
        except BridgeError as exc:
            self._rewind_and_pause(messages, exc)
            return 0
        self._caught_up()  # only now: what was consumed is applied
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
        messages = [first, *self.consumer.consume(self.batch_size - 1, 0)]
        # While records keep arriving, a batch is stored at most once per linger: one Redis call
        # per partition takes a linger's worth (a record after a quiet spell goes at once).
        wait = self._last_batch + self.linger_s - time.monotonic()
        if wait > 0 and len(messages) < self.batch_size:
            messages += self.consumer.consume(self.batch_size - len(messages), wait)
        self._last_batch = time.monotonic()
        return messages

    def _hold(self, messages: list[Message], batch: _Batch) -> tuple[list[Message], _Batch]:
        """Keep consuming, a linger at a time, while nothing in hand is urgent — up to ``hold``
        after the first record, so one Redis call per partition stores more of them. Urgent: a
        record due within two holds (stored a hold before its due time at the latest), a cancel
        or a record with its own delay-id (either may withdraw a record due soon), a dead letter,
        or a full batch. Records of a partition revoked meanwhile are left to its next owner."""
        deadline = time.monotonic() + self.hold_ms / 1000
        urgent = self._urgent(batch)
        while not urgent and len(messages) < self.batch_size:
            wait = min(deadline - time.monotonic(), self.linger_s or HOLD_SLICE_S)
            if wait <= 0:
                break
            more = [
                m for m in self.consumer.consume(self.batch_size - len(messages), wait)
                if not self._is_error(m)
            ]  # fmt: skip
            if more:
                messages += more
                later = self._parse(more)
                urgent = self._urgent(later)
                batch.merge(later)
        gone = set(batch.stored) - self.assigned
        if gone:
            messages = [m for m in messages if shard_of(m) not in gone]
            batch.drop(gone)
        self._last_batch = time.monotonic()
        return messages, batch

    def _urgent(self, batch: _Batch) -> bool:
        if batch.rejected:
            return True
        soon = self._clock_ms() + 2 * self.hold_ms
        for shard, (_, records) in batch.stored.items():
            for rec in records:
                if not isinstance(rec, Scheduled) or rec.due_ms <= soon:
                    return True
                if rec.given_id(shard.topic, shard.partition) is not None:
                    return True
        return False

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll_once()

    def close(self) -> None:
        """Commit what is stored and leave the group."""
        self.positions.store_lows(set(self.assigned), rebuild=False)
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

    def _handle(self, messages: list[Message], batch: _Batch) -> None:
        back = self.positions.went_back(batch.low.items())
        if back:
            messages = [m for m in messages if shard_of(m) not in back]
            batch.drop(back)
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
                self.positions.rebuild(added.lost)
            self.metrics.replaced.inc(added.replaced)
            self.metrics.cancelled.labels(result="cancelled").inc(added.cancelled)
            self.metrics.cancelled.labels(result="not-found").inc(added.not_found)
            for shard, offset, delay_id in added.missed:
                logger.warning(
                    "cancel of %s at %s offset %d found no waiting record (already claimed or "
                    "delivered, never scheduled, or waiting in another partition: a cancel needs "
                    "its record's key and partitioner)", delay_id, shard, offset,
                    extra={"repeat_key": "cancel-not-found"},
                )  # fmt: skip
        self._read_up_to(batch, set(batch.stored))
        counts: dict[str, int] = {}
        earliest: dict[Shard, int] = {}
        for shard, (_, records) in batch.stored.items():
            dues = [rec.due_ms for rec in records if isinstance(rec, Scheduled)]
            if dues:
                counts[shard.topic] = counts.get(shard.topic, 0) + len(dues)
                earliest[shard] = min(dues)
        for topic, n in counts.items():
            self.metrics.ingested.labels(delay_topic=topic).inc(n)
        if earliest:
            self._on_stored(earliest)

    def _read_up_to(self, batch: _Batch, applied: set[Shard]) -> None:
        """Move the horizons of the shards being caught up on past what this batch applied to
        ``applied`` (its newest record timestamps; nothing to do while none is caught up on)."""
        for shard in set(self.catch_up.ends()) & applied:
            if shard in batch.newest_ms:
                self.catch_up.read(shard, batch.newest_ms[shard])

    def _parse(self, messages: list[Message]) -> _Batch:
        """Parse a consumed batch. Per record only what the record needs: the per-partition
        figures are kept in locals while the partition stays the same (consumed batches come in
        runs of one partition) and written to the batch when it changes."""
        now_ms = self._clock_ms()
        batch = _Batch()
        shard: Shard | None = None
        records: list[Scheduled | Cancel] = []
        high = low = newest = 0

        def keep() -> None:
            if shard is None:
                return
            mine = batch.stored.get(shard)
            batch.stored[shard] = (high, records) if mine is None else (max(mine[0], high), records)
            batch.low[shard] = min(low, batch.low.get(shard, low))
            batch.newest_ms[shard] = max(newest, batch.newest_ms.get(shard, newest))

        for msg in messages:
            topic, partition, offset = coords(msg)
            ts_type, ts = msg.timestamp()
            if ts_type == 0:  # no timestamp: the moment it was read stands in
                ts = now_ms
            if shard is None or partition != shard.partition or topic != shard.topic:
                keep()
                shard = Shard(topic, partition)
                known = batch.stored.get(shard)
                records = [] if known is None else known[1]
                high = low = offset
                newest = ts
            high = max(high, offset)
            low = min(low, offset)
            newest = max(newest, ts)
            try:
                records.append(
                    parse_record(
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
        keep()
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

    # -------------------------------------------------------------- failure handling

    def _rewind_and_pause(self, messages: list[Message], exc: BridgeError) -> None:
        backoff = RETRY_BACKOFF_S[min(self._failures, len(RETRY_BACKOFF_S) - 1)]
        self._failures += 1
        if isinstance(exc, StoreError):
            self.metrics.redis_errors.labels(stage="ingress").inc()
        self.readiness.fail("ingress", f"ingress cannot store records: {exc}",
                            write_refused=isinstance(exc, WriteRefused))  # fmt: skip
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
