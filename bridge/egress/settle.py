"""Claimed records produced, and their delivery reports settled.

A delivered record is acknowledged; a failed one is handed to :mod:`.failures`, which says whether
it is produced again, claimed again after a back-off, or dead-lettered. A record leaves Redis only
from a successful delivery report: its acknowledgement goes along with its shard's next claim, or
at the latest a tick later (one call takes a tick's worth), and its fate goes to the journal then.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.config import EgressConfig
from bridge.egress.failures import Failures, Ident, InFlight, by_shard
from bridge.egress.outlet import Direct, Outlet
from bridge.egress.plan import ack_waits
from bridge.egress.recurring import sending
from bridge.errors import StoreError
from bridge.health import Readiness
from bridge.journal import Journal
from bridge.message import Priority, Scheduled, wire_headers
from bridge.metrics import Metrics
from bridge.store import AckBatch, Claimed, Shard, Store

if TYPE_CHECKING:
    from bridge.tracing import Spans

logger = logging.getLogger(__name__)

# A record produced and not acknowledged for this long means Kafka is not taking writes (a leader
# gone and not yet replaced, fewer in-sync replicas than min.insync.replicas): librdkafka retries
# within delivery.timeout.ms without a report meanwhile, and a healthy cluster acknowledges
# within milliseconds. /readyz says so, checked every WATCH_EVERY_S.
STALL_S, WATCH_EVERY_S = 5.0, 1.0


@dataclass(slots=True)
class Acked(AckBatch):
    """A shard's delivered records whose acknowledgement Redis has not applied yet, all claimed in
    one ``epoch`` of the shard (see :attr:`Claimed.epoch`), with what the metrics count of them
    once it has."""

    delivered: list[tuple[InFlight, int]] = field(default_factory=list)  # with the report's time


def count_acknowledged(
    metrics: Metrics, readiness: Readiness, delivered: list[tuple[InFlight, int]]
) -> None:
    """Count a batch of acknowledged records (with when each report came in): one label
    lookup per target, not per record."""
    per_target: Counter[str] = Counter()
    late_s: dict[Priority, list[float]] = defaultdict(list)
    dead_lettered: Counter[str] = Counter()
    expired: Counter[str] = Counter()  # by target
    for inflight, now_ms in delivered:
        record: Scheduled = inflight.claimed.record
        if inflight.dead_letter:
            dead_lettered[inflight.dlq_reason()] += 1
            if inflight.expired:
                expired[record.target] += 1
            continue
        late_from = record.late_from_ms()
        if record.recurring:  # its occurrence's instant; none: carried on, nothing delivered
            if inflight.occurrence_ms is None:
                continue
            late_from = max(late_from, inflight.occurrence_ms)
        per_target[record.target] += 1
        late_s[record.priority].append(max(0, now_ms - late_from) / 1000)
    for priority, amounts in late_s.items():
        metrics.lateness.labels(priority=priority.label).observe_many(amounts)
    for target, n in per_target.items():
        metrics.delivered.labels(target_topic=target).inc(n)
    for reason, n in dead_lettered.items():
        metrics.dead_lettered.labels(reason=reason).inc(n)
    for target, n in expired.items():
        metrics.expired.labels(target_topic=target).inc(n)
    if dead_lettered:
        readiness.ok("dlq-writes")


def journal_fates(journal: Journal, dlq: str, acks: Mapping[Shard, Acked]) -> None:
    """Journal the fates of acknowledged records: delivered, or dead-lettered to ``dlq``."""
    for shard, acked in acks.items():
        journal.delivered(
            shard, ((p.claimed.topic_id, p.fate(at_ms, dlq)) for p, at_ms in acked.delivered)
        )


def _watch(deliveries: Deliveries, now: float) -> None:
    """:meth:`Deliveries.watch`'s look at the records in flight, at ``now`` (monotonic s)."""
    sent = [p for p in deliveries.in_flight.values() if p.sent_s]
    oldest = min(sent, key=lambda p: p.sent_s, default=None)
    age = 0.0 if oldest is None else now - oldest.sent_s
    deliveries.metrics.oldest_inflight.set(age)
    failures, readiness = deliveries.failures, deliveries.readiness
    if oldest is not None and age > STALL_S:
        stalled = sum(1 for p in sent if now - p.sent_s > STALL_S)
        why = (
            f"{stalled:,} deliveries not acknowledged by Kafka for more than {STALL_S:.0f}s "
            f"(the oldest for {age:.0f}s, to {failures.topic(oldest)}): its brokers are "
            "not taking writes"
        )
        readiness.fail("deliveries", why)
    elif failures.failing:
        failing = "; ".join(f"to {t}: {e}" for t, e in sorted(failures.failing.items()))
        readiness.fail("deliveries", f"deliveries failing, retried: {failing}")
    else:
        readiness.ok("deliveries")


class Deliveries:
    """The records in flight: produced, their delivery reports applied on the mover's thread."""

    def __init__(
        self,
        producer: Producer,
        store: Store,
        metrics: Metrics,
        readiness: Readiness,
        config: EgressConfig,
        *,
        dead_letter: str,
        clock_ms: Callable[[], int],
        on_retry: Callable[[Mapping[Shard, Sequence[bytes]], int], None],
        journal: Journal | None = None,
        outlet: Outlet | None = None,
        spans: Spans | None = None,
    ) -> None:
        # Exactly once (a Transactions outlet): journaled in the records' transaction, not here.
        self.outlet: Outlet = outlet or Direct(producer)
        self.journal = journal if outlet is None else None
        self.store = store
        self.metrics = metrics
        self.readiness = readiness
        self.spans = spans  # tracing.enabled: a send span per delivery
        self.failures = Failures(metrics, readiness, dead_letter=dead_letter, config=config)
        # Acks ride the shard's next claim, or go alone after ack_waits[any records held ahead].
        self.ack_waits = ack_waits(config.tick, config.ahead)
        self.holding: Callable[[], int] = lambda: 0  # records held ahead (the Sender's count)
        # Records in flight at most: claims stop there. Ten batches keep the producer busy while
        # delivery reports of earlier ones come back (fewer cost throughput:
        # docs/bench/history.md); all are leased, so a crash redelivers at most this many.
        self._capacity = config.batch_size * 10
        self._clock_ms = clock_ms
        self.claim_again = on_retry  # records released or put back: when to claim them again
        self.in_flight: dict[Ident, InFlight] = {}
        # Records in flight claimed from a backlog, by priority (see bridge.egress.lanes).
        self.draining: Counter[Priority] = Counter()
        # Delivery reports not applied yet: (record, error, epoch ms when it came in, where Kafka
        # put it: partition and offset). Appended by whichever thread polls the producer, taken
        # from the left by the mover.
        self._reports: deque[tuple[Ident, KafkaError | None, int, int, int]] = deque()
        # Delivered records per shard, acknowledged in Redis with the shard's next claim or, at the
        # latest, at ack_by (monotonic s): one call takes a tick's worth.
        self.acked: dict[Shard, Acked] = {}
        self.ack_by: float | None = None
        # Notified whenever in-flight records settle; revocation waits on it.
        self._settled = threading.Condition()
        self._next_watch = 0.0

    def produce(self, ident: Ident, inflight: InFlight) -> None:
        """Produce a claimed record to its target (or, given up on, to the DLQ): the one place
        every record leaves by."""
        record = inflight.claimed.record
        callback = functools.partial(self._on_delivery, ident)
        now_ms = self._clock_ms()
        inflight.expire(now_ms, self.failures.max_lateness_ms)
        partition = -1  # the target's partitioner decides
        if inflight.dead_letter:
            key = None if inflight.stub else record.key
            topic, headers = self.failures.dead_letter, inflight.dlq_headers()
        elif record.recurring:  # an occurrence, and the schedule carried on (or that alone)
            out = sending(record, ident[0], now_ms, inflight)
            topic, key, headers, partition = out.topic, out.key, out.headers, out.partition
            if out.partition >= 0:  # no occurrence: no place in the target
                callback = functools.partial(self._on_delivery, ident, unplaced=True)
        else:
            topic, key, headers = record.target, record.delivered_key(), record.delivered_headers()
        if self.spans is not None:  # the delivered record's traceparent: its send span's
            reason = inflight.dlq_reason() if inflight.dead_letter else ""
            inflight.span, headers = self.spans.sending(
                record, ident[0], topic, headers, previous=inflight.span, dead_letter=reason
            )
        # The producer stamps the record; never earlier than the due time, whatever the local clock.
        timestamp = max(now_ms, record.due_ms)
        inflight.sent_s = time.monotonic()
        value = None if inflight.value_left_out else record.value
        try:
            fields = {
                "value": value,
                "key": key,
                "headers": wire_headers(headers),
                "timestamp": timestamp,
                "partition": partition,
            }
            self.outlet.send(ident, inflight, topic, callback, fields)
        except KafkaException as exc:
            # Refused locally (e.g. larger than message.max.bytes): same path as a report.
            self._reports.append((ident, exc.args[0], self._clock_ms(), -1, -1))

    def poll(self, timeout_s: float) -> None:
        """Serve the delivery reports (queued for :meth:`apply_reports`), waiting up to
        ``timeout_s`` for the first."""
        self.outlet.poll(timeout_s)

    def _on_delivery(
        self, ident: Ident, err: KafkaError | None, msg: Message | None, unplaced: bool = False
    ) -> None:
        # No message: refused before Kafka had it, or abandoned (see apply_reports); unplaced:
        # a schedule's record carried on with no occurrence delivered (recurring.sending).
        at = (-1, -1) if msg is None or unplaced else (msg.partition() or 0, msg.offset() or 0)
        self._reports.append((ident, err, self._clock_ms(), *at))

    def apply_reports(self) -> None:
        """Take in delivery reports: successes wait to be acknowledged (see :meth:`ack`),
        failures are retried or dead-lettered."""
        if not self._reports:
            return
        reports = [self._reports.popleft() for _ in range(len(self._reports))]
        retry: dict[int, dict[Shard, list[bytes]]] = defaultdict(lambda: defaultdict(list))
        abandoned: list[Ident] = []
        for ident, err, at_ms, partition, offset in reports:
            inflight = self.in_flight.get(ident)
            if inflight is None:
                continue  # a second report for a record delivered twice after a lease expiry
            if err is None:
                inflight.placed = (partition, offset)
                self._delivered(ident, inflight, at_ms)
                continue
            if self.spans is not None:
                self.spans.failed(inflight.span, err.str())
                inflight.span = None
            if err.fatal():  # its shard's transactions ended: leased for the next owner
                abandoned.append(ident)
                continue
            wait_ms = self.failures.failed(ident, inflight, err)
            if wait_ms is None:
                self.produce(ident, inflight)
            else:
                retry[wait_ms][ident[0]].append(ident[1])
        self.forget(by_shard(abandoned))
        self.failures.report_batch()
        refused: list[StoreError] = []
        for wait_ms, members in retry.items():
            self.forget(members)
            try:
                self.store.release(members, wait_ms)
                self.claim_again(members, wait_ms)
            except StoreError as exc:  # leases end once Redis answers (TakeOver.failed)
                refused.append(exc)
        if refused:
            raise refused[0]

    def _delivered(self, ident: Ident, inflight: InFlight, at_ms: int) -> None:
        """Kafka has the record: it waits to be acknowledged, with its shard's others."""
        inflight.sent_s = 0.0
        if self.spans is not None:
            self.spans.delivered(inflight.span, inflight.claimed.record, inflight.placed, at_ms)
            inflight.span = None
        self.failures.delivered(ident, inflight)
        epoch = inflight.claimed.epoch
        acked = self.acked.get(ident[0])
        if acked is not None and acked.epoch != epoch:  # the shard's state was retired
            self._apply({ident[0]: acked})
            acked = None
        if acked is None:  # not setdefault: that builds an Acked per record
            acked = self.acked[ident[0]] = Acked(epoch)
        acked.members.append(ident[1])
        acked.targets.append(inflight.claimed.record.target)
        if inflight.claimed.given_id() is not None:
            acked.with_ids += 1
        acked.delivered.append((inflight, at_ms))
        if self.ack_by is None:  # counted from when the report came in
            waited_ms = max(0, self._clock_ms() - at_ms)
            self.ack_by = time.monotonic() + (self.ack_waits[self.holding() > 0] - waited_ms) / 1000

    def watch(self) -> None:
        """At most every WATCH_EVERY_S: the age of the oldest record produced and not
        acknowledged (``delay_bridge_oldest_inflight_seconds``), and the ``deliveries`` check of
        /readyz — failing while a record waits longer than STALL_S for Kafka or a topic's last
        delivery report was a failure."""
        now = time.monotonic()
        if now >= self._next_watch:
            self._next_watch = now + WATCH_EVERY_S
            _watch(self, now)

    def ack(self, force: bool = False) -> None:
        """Acknowledge delivered records in Redis: a tick (or half an ``ahead`` window) after the
        first report came in, at once when ``force`` or no room is left (claims of their shards
        take them along sooner)."""
        if not self.acked:
            return
        force = force or self.room() <= 0
        if not force and self.ack_by is not None and time.monotonic() < self.ack_by:
            return
        self._apply(self.acked)

    def _apply(self, acks: Mapping[Shard, Acked]) -> None:
        self.store.ack(acks)
        self.acknowledged(acks)

    def acknowledged(self, acks: Mapping[Shard, Acked]) -> None:
        """Redis applied ``acks``: forget and count their records."""
        if not acks:
            return
        if self.journal is not None:
            journal_fates(self.journal, self.failures.dead_letter, acks)
        self.forget({shard: a.members for shard, a in acks.items()})
        count_acknowledged(
            self.metrics, self.readiness, [d for a in acks.values() for d in a.delivered]
        )
        self.acked = {s: a for s, a in self.acked.items() if s not in acks}
        if not self.acked:
            self.ack_by = None

    def track(self, ident: Ident, claimed: Claimed, draining: bool) -> InFlight:
        """A claimed record is in flight from now on; ``draining`` (taken from a backlog, see
        :meth:`Lanes.claimed`): it counts in :attr:`draining` until it is settled."""
        inflight = InFlight(claimed, dead_letter=claimed.record.dead_letter, draining=draining)
        self.failures.resume(ident, inflight)
        self.in_flight[ident] = inflight
        if draining:
            self.draining[claimed.record.priority] += 1
        return inflight

    def room(self) -> int:
        """How many more records may be claimed (and produced) now."""
        return self._capacity - len(self.in_flight)

    def acks_of(self, shards: Iterable[Shard]) -> dict[Shard, Acked]:
        """The acknowledgements waiting for ``shards``: a claim of theirs takes them along."""
        return {s: a for s in shards if (a := self.acked.get(s)) is not None}

    def release(self, members: Mapping[Shard, Sequence[bytes]]) -> None:
        """End the leases of records not produced or not acknowledged (shutdown): the next owner
        claims them at once. Forgotten here even if Redis fails (their leases run out)."""
        try:
            self.store.release(members)
        finally:
            self.forget(members)

    def draining_lanes(self) -> set[Priority]:
        """The priorities of the records in flight claimed from a backlog (see Lanes)."""
        return {p for p, n in self.draining.items() if n > 0}

    def of_shards(self, shards: set[Shard]) -> dict[Shard, list[bytes]]:
        """The records in flight of ``shards``, each shard's (empty if none)."""
        held: dict[Shard, list[bytes]] = {s: [] for s in shards}
        for shard, member in self.in_flight:
            if shard in held:
                held[shard].append(member)
        return held

    def due_in_flight(self, now_ms: int) -> Counter[Priority]:
        """Records in flight and due by ``now_ms``, by priority (read by the metrics thread)."""
        # list() copies the values in one step, while the mover's thread may change the dict.
        return Counter(
            p.claimed.record.priority
            for p in list(self.in_flight.values())
            if p.claimed.record.due_ms <= now_ms
        )

    def forget(self, members: Mapping[Shard, Sequence[bytes]]) -> None:
        """These records are no longer in flight (acknowledged, or released to be claimed)."""
        for shard, batch in members.items():
            for m in batch:
                gone = self.in_flight.pop((shard, m), None)
                if gone is not None and gone.draining:
                    self.draining[gone.claimed.record.priority] -= 1
        with self._settled:
            self._settled.notify_all()

    def wait_settled(self, shards: set[Shard], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no record of these partitions is in flight; returns
        how many still are. Called from another thread than the mover's."""
        gone = {s.base() for s in shards}

        def left() -> int:
            # list() copies the keys in one step, while the mover's thread may change the dict
            return sum(1 for s, _ in list(self.in_flight) if s.base() in gone)

        with self._settled:
            self._settled.wait_for(lambda: left() == 0, timeout_s)
            return left()

    def drain(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic s) for the records in flight; release the leases of
        those unacknowledged then (shutdown; with exactly-once delivery they stay leased)."""
        while self.in_flight and time.monotonic() < deadline:
            self.outlet.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            self.apply_reports()
            self.ack(force=True)
        self.outlet.stop()
        if self.in_flight and self.outlet.exactly_once:
            logger.warning(
                "%d records unacknowledged at shutdown; left leased for the next owner, who "
                "reconciles them with the journal",
                len(self.in_flight),
            )
        elif self.in_flight:
            logger.warning(
                "%d records unacknowledged at shutdown; leases released", len(self.in_flight)
            )
            self.release(by_shard(self.in_flight))
