"""Claimed records produced, and their delivery reports settled: acknowledged, retried or DLQ'd.

A record leaves Redis only from a successful delivery report. Permanent failures (unknown topic,
too large, not authorized) are retried ``max_attempts`` times, then the record goes to the DLQ as
``delivery-failed`` and is acknowledged once the DLQ has it; a copy the DLQ refuses as too large
goes again without its value (it stays in the delay topic at ``delay-origin``), and a record the
DLQ refuses otherwise stays bound for it when it is claimed again. Transient failures end the
lease so the record is claimed again after a back-off. A record stored bound for the DLQ (a
far-future record whose payload was gone when it was read back) goes there at its due time.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bridge.health import Readiness
from bridge.kafka import produce
from bridge.message import (
    Priority,
    Reason,
    Scheduled,
    dead_letter_headers,
    dead_letter_reason,
    origin,
    wire_headers,
)
from bridge.metrics import Metrics
from bridge.store import Claimed, Shard, Store

logger = logging.getLogger(__name__)

PERMANENT_ERRORS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_ARG,
    }
)
TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# A record produced and not acknowledged for this long means Kafka is not taking writes (a leader
# gone and not yet replaced, fewer in-sync replicas than min.insync.replicas): librdkafka retries
# within delivery.timeout.ms without a report meanwhile, and a healthy cluster acknowledges
# within milliseconds. /readyz says so, checked every WATCH_EVERY_S.
STALL_S, WATCH_EVERY_S = 5.0, 1.0
# A record whose delivery failed is claimable again after this long, doubling per failure.
RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS = 500, 5_000
RETRIES_KEPT = 100_000  # failure counts remembered (records another replica took are forgotten)

Ident = tuple[Shard, bytes]  # a claimed record: its shard and member


def backoff(base: float, cap: float, failures: int) -> float:
    """``base`` doubled per failure after the first, at most ``cap``."""
    return float(min(cap, base * 2 ** min(max(failures - 1, 0), 30)))


@dataclass(slots=True)
class InFlight:
    """A claimed record produced (or about to be) and not yet acknowledged."""

    claimed: Claimed
    attempts: int = 0
    dead_letter: bool = False
    error: str = ""  # Kafka's last refusal, for the DLQ's delay-error-detail
    sent_s: float = 0.0  # monotonic, when last produced; 0 once Kafka acknowledged it
    draining: bool = False  # claimed from a backlog: counts in Deliveries.draining
    value_left_out: bool = False  # its DLQ copy goes without its value (too large with it)


@dataclass
class Acked:
    """A shard's delivered records whose acknowledgement Redis has not applied yet, all claimed in
    one ``epoch`` of the shard (see :attr:`Claimed.epoch`)."""

    epoch: str
    members: list[bytes] = field(default_factory=list)
    ids: list[tuple[str, bytes]] = field(default_factory=list)  # those in the id index
    delivered: list[tuple[InFlight, int]] = field(default_factory=list)  # with the report's time


def by_shard(idents: Iterable[Ident]) -> dict[Shard, list[bytes]]:
    """Records (shard, member) grouped by shard, as the store's calls take them."""
    grouped: dict[Shard, list[bytes]] = defaultdict(list)
    for shard, member in idents:
        grouped[shard].append(member)
    return grouped


def count_acknowledged(
    metrics: Metrics, readiness: Readiness, delivered: list[tuple[InFlight, int]]
) -> None:
    """Count a batch of acknowledged records (with when each report came in): one label
    lookup per target, not per record."""
    per_target: Counter[str] = Counter()
    late_s: dict[Priority, list[float]] = defaultdict(list)
    dead_lettered: Counter[str] = Counter()
    for inflight, now_ms in delivered:
        record: Scheduled = inflight.claimed.record
        if inflight.dead_letter:
            reason = dead_letter_reason(record.headers) if record.dead_letter else ""
            dead_lettered[reason or Reason.DELIVERY_FAILED.value] += 1
            continue
        per_target[record.target] += 1
        late_s[record.priority].append(max(0, now_ms - record.late_from_ms()) / 1000)
    for priority, amounts in late_s.items():
        metrics.lateness.labels(priority=priority.label).observe_many(amounts)
    for target, n in per_target.items():
        metrics.delivered.labels(target_topic=target).inc(n)
    for reason, n in dead_lettered.items():
        metrics.dead_lettered.labels(reason=reason).inc(n)
    if dead_lettered:
        readiness.ok("dlq-writes")


class Deliveries:
    """The records in flight: produced, their delivery reports applied on the mover's thread."""

    def __init__(
        self,
        producer: Producer,
        store: Store,
        metrics: Metrics,
        readiness: Readiness,
        *,
        dead_letter: str,
        max_attempts: int,
        ack_wait_ms: int,
        clock_ms: Callable[[], int],
        send: Callable[[Ident, InFlight], None],
        on_retry: Callable[[Mapping[Shard, Sequence[bytes]], int], None],
    ) -> None:
        self.producer = producer
        self.store = store
        self.metrics = metrics
        self.readiness = readiness
        self.dead_letter = dead_letter
        self.max_attempts = max_attempts
        self._ack_wait_ms = ack_wait_ms
        self._clock_ms = clock_ms
        self._send = send  # the one way a record is produced (a subclass of the mover may watch)
        self._on_retry = on_retry
        self.in_flight: dict[Ident, InFlight] = {}
        # Records in flight claimed from a backlog, by priority (see bridge.egress.lanes).
        self.draining: Counter[Priority] = Counter()
        # Delivery reports not applied yet: (record, error, epoch ms when it came in). Appended
        # by whichever thread polls the producer, taken from the left by the mover.
        self._reports: deque[tuple[Ident, KafkaError | None, int]] = deque()
        # Delivered records per shard, acknowledged in Redis with the shard's next claim or, at the
        # latest, at ack_by (monotonic s): one call takes a tick's worth.
        self.acked: dict[Shard, Acked] = {}
        self.ack_by: float | None = None
        # Failed deliveries in a row per record, for its back-off; dropped when it is delivered.
        self._retries: dict[Ident, int] = {}
        # Records given up on whose DLQ copy failed: claimed again, they go to the DLQ at once.
        self._given_up: dict[Ident, InFlight] = {}
        # Notified whenever in-flight records settle; revocation waits on it.
        self._settled = threading.Condition()
        # Topics whose last delivery report was a failure (retried), with the error.
        self._failing: dict[str, str] = {}
        self._next_watch = 0.0

    def produce(self, ident: Ident, inflight: InFlight) -> None:
        """Produce a claimed record to its target (or, given up on, to the DLQ)."""
        record = inflight.claimed.record
        callback = functools.partial(self._on_delivery, ident)
        if inflight.dead_letter:
            topic, key, headers = self.dead_letter, record.key, self._dlq_headers(inflight)
        else:
            topic, key, headers = record.target, record.delivered_key(), record.delivered_headers()
        # The producer stamps the record; never earlier than the due time, whatever the local clock.
        timestamp = max(self._clock_ms(), record.due_ms)
        inflight.sent_s = time.monotonic()
        value = None if inflight.value_left_out else record.value
        try:
            produce(
                self.producer,
                topic,
                value=value,
                key=key,
                headers=wire_headers(headers),
                timestamp=timestamp,
                on_delivery=callback,
            )
        except KafkaException as exc:
            # Refused locally (e.g. larger than message.max.bytes): same path as a report.
            self._reports.append((ident, exc.args[0], self._clock_ms()))

    def _dlq_headers(self, inflight: InFlight) -> list[tuple[str, bytes | None]]:
        record = inflight.claimed.record
        if record.dead_letter:  # bound for the DLQ when it was stored, with its headers
            return record.headers
        shard = inflight.claimed.shard
        where = origin(shard.topic, shard.partition, record.offset)
        detail = f"delivery to {record.target} failed {inflight.attempts} times: {inflight.error}"
        if inflight.value_left_out:
            detail += (
                f" (value of {len(record.value or b'')} bytes left out: the whole copy is "
                f"larger than the DLQ takes; it stays at {where})"
            )
        return dead_letter_headers(record.headers, Reason.DELIVERY_FAILED, detail, where)

    def _on_delivery(self, ident: Ident, err: KafkaError | None, _msg: Message) -> None:
        self._reports.append((ident, err, self._clock_ms()))

    def apply_reports(self) -> None:
        """Take in delivery reports: successes wait to be acknowledged (see :meth:`ack`),
        failures are retried or dead-lettered."""
        if not self._reports:
            return
        reports = [self._reports.popleft() for _ in range(len(self._reports))]
        retry: dict[int, dict[Shard, list[bytes]]] = defaultdict(lambda: defaultdict(list))
        failed: Counter[tuple[str, str, int]] = Counter()
        errors: Counter[str] = Counter()
        for ident, err, at_ms in reports:
            inflight = self.in_flight.get(ident)
            if inflight is None:
                continue  # a second report for a record delivered twice after a lease expiry
            if err is None:
                inflight.sent_s = 0.0
                if self._failing:
                    self._failing.pop(self._topic(inflight), None)
                epoch = inflight.claimed.epoch
                acked = self.acked.get(ident[0])
                if acked is not None and acked.epoch != epoch:  # the shard's state was retired
                    self._apply({ident[0]: acked})
                    acked = None
                if acked is None:  # not setdefault: that builds an Acked per record
                    acked = self.acked[ident[0]] = Acked(epoch)
                acked.members.append(ident[1])
                given = inflight.claimed.given_id()
                if given is not None:
                    acked.ids.append((given, ident[1]))
                acked.delivered.append((inflight, at_ms))
                self._retries.pop(ident, None)
                self._given_up.pop(ident, None)
                if self.ack_by is None:  # counted from when the report came in
                    waited_ms = max(0, self._clock_ms() - at_ms)
                    self.ack_by = time.monotonic() + (self._ack_wait_ms - waited_ms) / 1000
                continue
            errors[err.name()] += 1
            if inflight.dead_letter and err.code() in TOO_LARGE and not inflight.value_left_out:
                inflight.value_left_out = True
                self._send(ident, inflight)
                continue
            if err.code() in PERMANENT_ERRORS and not inflight.dead_letter:
                inflight.attempts += 1
                inflight.error = f"{err.name()}: {err.str()}"
                if inflight.attempts >= self.max_attempts:
                    inflight.dead_letter = True
                    logger.warning(
                        "delivery of %s to %s failed %d times (%s); dead-lettering",
                        inflight.claimed.record.delay_id,
                        inflight.claimed.record.target,
                        inflight.attempts,
                        err.str(),
                    )
                self._send(ident, inflight)
                continue
            topic = self._topic(inflight)
            self._failing[topic] = err.str()
            if len(self._retries) >= RETRIES_KEPT:
                self._retries.clear()
                self._given_up.clear()
            if inflight.dead_letter and not inflight.claimed.record.dead_letter:
                self._given_up[ident] = inflight
            tries = self._retries[ident] = self._retries.get(ident, 0) + 1
            wait_ms = int(backoff(RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS, tries))
            retry[wait_ms][ident[0]].append(ident[1])
            failed[(topic, err.str(), wait_ms)] += 1
        for wait_ms, members in retry.items():
            self.store.release(members, wait_ms)
            self.forget(members)
            self._on_retry(members, wait_ms)
        for name, n in errors.items():
            self.metrics.delivery_errors.labels(error=name).inc(n)
        self._report_failures(failed)

    def _topic(self, inflight: InFlight) -> str:
        return self.dead_letter if inflight.dead_letter else inflight.claimed.record.target

    def watch(self) -> None:
        """At most every WATCH_EVERY_S: the age of the oldest record produced and not
        acknowledged (``delay_bridge_oldest_inflight_seconds``), and the ``deliveries`` check of
        /readyz — failing while a record waits longer than STALL_S for Kafka or a topic's last
        delivery report was a failure."""
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_EVERY_S
        sent = [p for p in self.in_flight.values() if p.sent_s]
        oldest = min(sent, key=lambda p: p.sent_s, default=None)
        age = 0.0 if oldest is None else now - oldest.sent_s
        self.metrics.oldest_inflight.set(age)
        if oldest is not None and age > STALL_S:
            stalled = sum(1 for p in sent if now - p.sent_s > STALL_S)
            why = (
                f"{stalled:,} deliveries not acknowledged by Kafka for more than {STALL_S:.0f}s "
                f"(the oldest for {age:.0f}s, to {self._topic(oldest)}): its brokers are not "
                "taking writes"
            )
            self.readiness.fail("deliveries", why)
            return
        if self._failing:
            failing = "; ".join(f"to {t}: {e}" for t, e in sorted(self._failing.items()))
            self.readiness.fail("deliveries", f"deliveries failing, retried: {failing}")
        else:
            self.readiness.ok("deliveries")

    def ack(self, force: bool = False) -> None:
        """Acknowledge delivered records in Redis: a tick (or half an ``ahead`` window) after the
        first report came in, at once when ``force`` (claims of their shards take them along
        sooner)."""
        if not self.acked:
            return
        if not force and self.ack_by is not None and time.monotonic() < self.ack_by:
            return
        self._apply(self.acked)

    def _apply(self, acks: Mapping[Shard, Acked]) -> None:
        self.store.ack(
            {s: a.members for s, a in acks.items()},
            {s: a.ids for s, a in acks.items()},
            {s: a.epoch for s, a in acks.items()},
        )
        self.acknowledged(acks)

    def acknowledged(self, acks: Mapping[Shard, Acked]) -> None:
        """Redis applied ``acks``: forget and count their records."""
        if not acks:
            return
        self.forget({shard: a.members for shard, a in acks.items()})
        count_acknowledged(
            self.metrics, self.readiness, [d for a in acks.values() for d in a.delivered]
        )
        self.acked = {s: a for s, a in self.acked.items() if s not in acks}
        if not self.acked:
            self.ack_by = None

    def _report_failures(self, failed: Counter[tuple[str, str, int]]) -> None:
        """One line per topic and error; a DLQ that refuses records also fails /readyz."""
        for (topic, error, wait_ms), n in sorted(failed.items()):
            if topic == self.dead_letter:
                self.metrics.dlq_errors.inc(n)
                self.readiness.fail("dlq-writes", f"DLQ produce to {topic} failed: {error}")
            logger.warning(
                "%d deliveries to %s failed (%s); retrying in %.1fs",
                n,
                topic,
                error,
                wait_ms / 1000,
            )

    def track(self, ident: Ident, claimed: Claimed, draining: bool) -> InFlight:
        """A claimed record is in flight from now on; ``draining`` (taken from a backlog, see
        :meth:`Lanes.claimed`): it counts in :attr:`draining` until it is settled."""
        inflight = InFlight(claimed, dead_letter=claimed.record.dead_letter, draining=draining)
        given_up = self._given_up.get(ident)
        if given_up is not None:  # its attempts are spent: the DLQ's turn again
            inflight.dead_letter, inflight.attempts = True, given_up.attempts
            inflight.error, inflight.value_left_out = given_up.error, given_up.value_left_out
        self.in_flight[ident] = inflight
        if draining:
            self.draining[claimed.record.priority] += 1
        return inflight

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
        those unacknowledged then (shutdown)."""
        while self.in_flight and time.monotonic() < deadline:
            self.producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            self.apply_reports()
            self.ack(force=True)
        if self.in_flight:
            logger.warning(
                "%d records unacknowledged at shutdown; leases released", len(self.in_flight)
            )
            released = by_shard(self.in_flight)
            self.store.release(released)
            self.forget(released)
