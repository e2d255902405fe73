"""The ingress loop: consume the delay topics, store valid records in Redis, dead-letter the rest.

For each batch: parse → DLQ the invalid ones and wait for Kafka's acknowledgement → store the
valid ones (and the shard watermark) in Redis. If Redis or the DLQ fails, the consumer rewinds to
the batch's first offsets and pauses, so nothing is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from bridge.catchup import SAY_EVERY_S, CatchUp
from bridge.config import Config
from bridge.errors import StoreError, WriteRefused, log_failed_turn
from bridge.health import Readiness
from bridge.ingress.adds import NO_READS, Adds, TopicReads
from bridge.ingress.batch import Batch, coords, parse_batch, shard_of, shards_of
from bridge.ingress.careful import is_bug, one_offset_at_a_time
from bridge.ingress.dead_letter import DeadLetters
from bridge.ingress.holds import Holds
from bridge.ingress.journal_waits import JournalWaits
from bridge.ingress.membership import Membership, Owner, TopicFacts
from bridge.ingress.quotas import Quotas, message_finder
from bridge.ingress.restarts import Restarts, close_aside, closed, is_fatal
from bridge.ingress.settled import Settled
from bridge.journal import Journal
from bridge.message import Scheduled, wall_ms
from bridge.metrics import Metrics
from bridge.store import (
    Added,
    PerLane,
    Shard,
    Store,
    lane_firsts,
)

if TYPE_CHECKING:
    from bridge.tracing import Spans

logger = logging.getLogger(__name__)


COMMIT_INTERVAL_S = 1.0  # how often the lowest pending offsets are stored for the auto-commit
# A batch Redis refused is read again after this long, the next value for each refusal in a row.
# The last is short: once Redis takes writes again, ingest resumes within it.
RETRY_BACKOFF_S = (0.1, 0.25, 0.5, 1.0)
HOLD_SLICE_S = 0.01  # how often a hold looks at what came in when linger is 0
TOPIC_CHECK_INTERVAL_S = 30.0  # how often the owned delay topics' ids are compared with Redis's


class Ingress:
    """The delay-topic consumer loop. Owns the consumer and a DLQ producer."""

    def __init__(
        self,
        new_consumer: Callable[[], Consumer],
        store: Store,
        metrics: Metrics,
        config: Config,
        dead_letters: DeadLetters,
        *,
        topics: TopicFacts,
        owner: Owner,
        readiness: Readiness,
        catch_up: CatchUp,
        settled: Settled | None = None,
        reads: TopicReads = NO_READS,
        spans: Spans | None = None,
    ) -> None:
        """``new_consumer`` makes the delay topics' consumer (again, after a fault: see
        :class:`Restarts`); ``dead_letters`` sends what is refused; ``topics`` says what Kafka
        knows of the delay topics, ``owner`` is told of the shards assigned, revoked and
        stored to; ``settled`` reads the journal for a rebuild, ``reads`` the delay topic for
        what the id index and default delay-ids point at."""
        self.consumer = new_consumer()
        self.restarts = Restarts(new_consumer)  # to start it again (restart_soon)
        self.catch_up = catch_up
        self.store = store
        self.reads = reads
        self.spans = spans  # tracing.enabled: a store span per record stored
        self.rules = dead_letters.rules
        self.metrics = metrics
        self.config = config.ingress  # batch_size, linger (ms), hold (ms)
        # Records due further out than this when stored are kept as references (None: none is).
        self.payload_horizon_ms = config.store.payload_horizon if config.store.references else None
        self.bucket_ms = config.store.bucket_ms
        self._last_batch = 0.0  # monotonic s: when the last batch was consumed
        self._owner = owner
        self.readiness = readiness
        self.dead_letters = dead_letters
        self.holds = Holds(self.readiness, self.catch_up)
        self.quotas = Quotas(config.limits.max_waiting_per_target, store)
        self.membership = Membership(
            self.consumer,
            store,
            metrics,
            self.catch_up,
            topics=config.topics.delay,
            facts=topics,
            owner=owner,
            paused=lambda: bool(self._paused_until),
            settled=settled,
            journal_waits=JournalWaits(self.catch_up, readiness),
            adds=Adds(
                store,
                catch_up,
                partitions=lambda: partition_counts(self._partitions(), self.assigned),
                counted=topics.partitions,
                reads=reads,
                report=lambda added: _report(added, metrics, dead_letters.journal, self._clock_ms),
                kept=metrics.cancels_kept.set,
            ),
        )
        self.positions = self.membership.positions
        self._clock_ms = wall_ms
        self._partitions = topics.partitions  # delay topic -> partition count, as Kafka last said
        self._next_commit = 0.0
        self._next_topic_check = time.monotonic() + TOPIC_CHECK_INTERVAL_S
        self._paused_until = 0.0
        self._failures = 0
        self._careful = False  # the last batch failed with a bug: the next goes an offset at a time
        self.last_loop = time.monotonic()

    @property
    def assigned(self) -> set[Shard]:
        """The delay-topic partitions this replica owns."""
        return self.positions.assigned

    @property
    def marks(self) -> dict[Shard, int]:
        """The watermark of each owned shard as last read or written by this process."""
        return self.positions.marks

    @property
    def joined(self) -> bool:
        """Whether the consumer is in its group (no session lost since it last joined)."""
        return self.membership.joined

    @property
    def lost(self) -> frozenset[Shard]:
        """Partitions lost with the group session, until the group forms again."""
        return self.membership.lost

    def subscribe(self) -> None:
        """Join the consumer group on the delay topics."""
        self.membership.subscribe()

    def restart_soon(self, why: str) -> None:
        """Close the consumer and start a new one before the next batch (:class:`Restarts`).
        Called from the statistics callback, inside a poll, where the consumer cannot close."""
        self.restarts.soon(why)

    def _restart(self) -> None:
        fatal, leaving = self.restarts.fatal, self.restarts.leaving
        self.restarts.take()
        failed = self.consumer
        if not fatal:
            fatal = not closed(lambda: self.membership.close(leave=leaving))
        # What the close did not revoke (its partitions are taken up again by the new one: a
        # static member at once, as a restarted replica is).
        self.membership.release(set(self.assigned))
        assert self.restarts.new_consumer is not None
        consumer = self.restarts.new_consumer()
        self.consumer = self.membership.consumer = self.positions.consumer = consumer
        self.membership.subscribe()
        if fatal:  # its callbacks no longer reach the membership: it is not the consumer now
            close_aside(failed)

    def poll_once(self, timeout: float = SAY_EVERY_S) -> int:
        """Consume one batch and handle it; returns how many records it held."""
        if self.restarts.why:
            self._restart()
        self.last_loop = time.monotonic()
        if self.last_loop >= self._next_commit:
            self._next_commit = self.last_loop + COMMIT_INTERVAL_S
            self.positions.store_lows(set(self.assigned))
            self.dead_letters.producer.poll(0)  # the journal's delivery reports
        if self.last_loop >= self._next_topic_check:
            self._next_topic_check = self.last_loop + TOPIC_CHECK_INTERVAL_S
            self.positions.check_incarnations()
        if self._paused_until:
            if time.monotonic() < self._paused_until:
                self._discard(self.consumer.consume(self.config.batch_size, min(timeout, 0.1)))
                return 0
            self._resume()
        self.holds.read_again(self.consumer, self.assigned)
        self.membership.try_held()
        messages = self._consume(timeout)
        if not messages:
            self.membership.caught_up()
            return 0
        messages = [m for m in messages if not _is_error(self.restarts, m)]
        if not messages:
            return 0
        self.catch_up.taken(shards_of(messages))  # read, not applied: behind until caught_up
        batch = parse_batch(messages, self.rules, self._clock_ms(), self.catch_up.stamp_limit())
        if self.config.hold:
            messages, batch = self._hold(messages, batch)
        try:
            if self._careful:  # the batch read again after a bug: see bridge.ingress.careful
                one_offset_at_a_time(self._handle, self.marks, messages, batch)
            else:
                self._handle(messages, batch)
        except Exception as exc:  # Redis or Kafka away, or a bug: read the batch again later
            self._careful = is_bug(exc)
            self._rewind_and_pause(messages, exc)
            return 0
        self._careful = False
        self.membership.caught_up()  # only now: what was consumed is applied
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
        messages = [first, *self.consumer.consume(self.config.batch_size - 1, 0)]
        # While records keep arriving, a batch is stored at most once per linger: one Redis call
        # per partition takes a linger's worth (a record after a quiet spell goes at once).
        wait = self._last_batch + self.config.linger / 1000 - time.monotonic()
        if wait > 0 and len(messages) < self.config.batch_size:
            messages += self.consumer.consume(self.config.batch_size - len(messages), wait)
        self._last_batch = time.monotonic()
        return messages

    def _hold(self, messages: list[Message], batch: Batch) -> tuple[list[Message], Batch]:
        """Keep consuming, a linger at a time, while nothing in hand is urgent — up to ``hold``
        after the first record, so one Redis call per partition stores more of them. Urgent: a
        record due within two holds (stored a hold before its due time at the latest), a cancel
        or a record with its own delay-id (either may withdraw a record due soon), a dead letter,
        or a full batch. Records of a partition revoked meanwhile are left to its next owner."""
        deadline = time.monotonic() + self.config.hold / 1000
        urgent = batch.urgent(self._clock_ms() + 2 * self.config.hold)
        while not urgent and len(messages) < self.config.batch_size:
            wait = min(deadline - time.monotonic(), self.config.linger / 1000 or HOLD_SLICE_S)
            if wait <= 0:
                break
            got = self.consumer.consume(self.config.batch_size - len(messages), wait)
            if more := [m for m in got if not _is_error(self.restarts, m)]:
                messages += more
                later = parse_batch(more, self.rules, self._clock_ms(), self.catch_up.stamp_limit())
                if urgent := later.urgent(self._clock_ms() + 2 * self.config.hold):
                    self.catch_up.taken(shards_of(messages))  # a cancel may be among them
                batch.merge(later)
            if not urgent:  # nothing held can withdraw a record: say how far each is read
                self.membership.verdict()
        gone = set(batch.stored) - self.assigned
        if gone:
            messages = [m for m in messages if shard_of(m) not in gone]
            batch.drop(gone)
        self._last_batch = time.monotonic()
        return messages, batch

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll_once()

    def close(self, *, leave: bool = True) -> None:
        """Commit what is stored and close the consumer; ``leave``: leave the group too (a
        static member that does not stays one until its session runs out)."""
        self.membership.close(leave=leave)
        self.dead_letters.flush()

    def _handle(self, messages: list[Message], batch: Batch) -> None:
        started_ns = time.time_ns()  # the store spans' start
        # Held partitions are read again from their record once their back-off is over; what
        # came of them meanwhile (fetched before the hold) waits for that.
        back = self.positions.went_back(batch.low.items()) | (set(batch.low) & self.holds.waiting())
        back |= set(batch.low) & self.membership.journal_waits.waiting()
        if back:
            messages = [m for m in messages if shard_of(m) not in back]
            batch.drop(back)
        if self.quotas:
            partitions = partition_counts(self._partitions(), self.assigned)
            find = message_finder(messages)
            self.quotas.apply(batch, self.marks, partitions, find, self.membership.settled.has)
        refused = self.dead_letters.send(batch.rejected) if batch.rejected else {}
        for shard, (offset, why) in refused.items():
            batch.stop_at(shard, offset, self.marks.get(shard, -1))
            self.holds.hold(self.consumer, shard, offset, why)
        if batch.stored:
            self.membership.settled.drop(batch.stored)
            expected = {s: self.marks[s] for s in batch.stored if s in self.marks}
            horizon = self.payload_horizon_ms
            refer_after = None if horizon is None else self._clock_ms() + horizon
            added = self.membership.adds.add(batch.stored, expected, refer_after, self.bucket_ms)
            for shard in added.lost:
                del batch.stored[shard]  # refused whole: re-read after the rebuild
            for shard, (high, _) in batch.stored.items():
                self.marks[shard] = max(high, self.marks.get(shard, -1))
            if added.lost:
                self.positions.rebuild(added.lost)
            if self.spans is not None:
                self.spans.stored(batch.stored, started_ns)
        self._read_up_to(batch, set(batch.stored))
        self.dead_letters.applied(self.marks)
        self.holds.passed(set(batch.low) - set(refused))
        counts: dict[str, int] = {}
        earliest: dict[Shard, PerLane] = {}
        for shard, (_, records) in batch.stored.items():
            dues = [(rec.priority, rec.due_ms) for rec in records if isinstance(rec, Scheduled)]
            if dues:
                counts[shard.topic] = counts.get(shard.topic, 0) + len(dues)
                earliest[shard] = lane_firsts(dues)
        for topic, n in counts.items():
            self.metrics.ingested.labels(delay_topic=topic).inc(n)
        if earliest:
            self._owner.stored(earliest)

    def _read_up_to(self, batch: Batch, applied: set[Shard]) -> None:
        """Tell how far this batch applied ``applied`` (its newest record timestamps): the
        horizons of the shards caught up on, and of those read live (bridge.catchup)."""
        for shard in applied:
            if shard in batch.newest_ms:
                self.catch_up.read(shard, batch.newest_ms[shard])

    def _rewind_and_pause(self, messages: list[Message], exc: Exception) -> None:
        backoff = RETRY_BACKOFF_S[min(self._failures, len(RETRY_BACKOFF_S) - 1)]
        self._failures += 1
        if isinstance(exc, StoreError):
            self.metrics.redis_errors.labels(stage="ingress").inc()
        self.readiness.fail(
            "ingress",
            f"ingress cannot store records: {exc}",
            write_refused=isinstance(exc, WriteRefused),
        )
        log_failed_turn(logger, exc, "batch not stored, retrying in %.1fs: %s", backoff, exc)
        _rewind(self.consumer, messages, self.assigned, self.marks)
        self._pause(backoff)

    def _pause(self, seconds: float) -> None:
        self._paused_until = time.monotonic() + seconds
        self.consumer.pause(_partitions(self.assigned))

    def _resume(self) -> None:
        self._paused_until = 0.0
        self.consumer.resume(_partitions(self.assigned - self.holds.waiting()))

    def _discard(self, messages: Sequence[Message]) -> None:
        """Messages fetched before a pause took effect are re-read after resuming."""
        valid = [m for m in messages if m.error() is None]
        if valid:
            _rewind(self.consumer, valid, self.assigned, self.marks)


def _partitions(shards: Iterable[Shard]) -> list[TopicPartition]:
    return [TopicPartition(s.topic, s.partition) for s in shards]


def _is_error(restarts: Restarts, msg: Message) -> bool:
    """Whether ``msg`` is the consumer's error, not a record (a fatal one restarts the consumer)."""
    error = msg.error()
    if error is None:
        return False
    if error.code() == KafkaError._PARTITION_EOF:  # enable.partition.eof: an end, not an error
        return True
    if is_fatal(error):
        restarts.failed(error)
    else:
        logger.warning("consumer: %s", error)
    return True


def _rewind(
    consumer: Consumer, messages: Sequence[Message], assigned: set[Shard], marks: dict[Shard, int]
) -> None:
    """Read ``messages`` again, but not what of them was applied already (up to ``marks``): read
    from its start, a partition a batch that failed half-way had stored would look like one
    whose offsets went back, and be retired."""
    first: dict[Shard, int] = {}
    for msg in messages:
        topic, partition, offset = coords(msg)
        shard = Shard(topic, partition)
        first[shard] = min(first.get(shard, offset), offset)
    for shard, offset in first.items():
        if shard in assigned:
            start = max(offset, marks.get(shard, -1) + 1)
            consumer.seek(TopicPartition(shard.topic, shard.partition, start))


def _report(
    added: Added, metrics: Metrics, journal: Journal | None, clock_ms: Callable[[], int]
) -> None:
    """Count the replacements and cancels a store applied and journal what they withdrew; log
    each cancel that found nothing."""
    if added.withdrawn and journal is not None:
        journal.withdrawn(added.withdrawn, clock_ms())
    metrics.replaced.inc(added.replaced)
    metrics.cancelled.labels(result="cancelled").inc(added.cancelled)
    metrics.cancelled.labels(result="not-found").inc(added.not_found)
    for shard, offset, delay_id in added.missed:
        logger.warning(
            "cancel of %s at %s offset %d found no waiting record in any partition of its "
            "topic (already claimed or delivered, or never scheduled)",
            delay_id,
            shard,
            offset,
            extra={"repeat_key": "cancel-not-found"},
        )


def partition_counts(known: Mapping[str, int], assigned: set[Shard]) -> dict[str, int]:
    """Each delay topic's partition count: as Kafka last said (``known``), or more where an
    ``assigned`` partition says the topic grew since."""
    counts = dict(known)
    for shard in assigned:
        counts[shard.topic] = max(counts.get(shard.topic, 0), shard.partition + 1)
    return counts
