"""Egress: claim due records from the owned shards, produce them, acknowledge on delivery.

A record leaves Redis only from a successful delivery report. Permanent failures (unknown
topic, too large, not authorized) are retried ``max_attempts`` times, then the record goes to the
DLQ as ``delivery-failed`` and is acknowledged once the DLQ has it. Transient failures end the
lease at once so the next claim retries. The mover sleeps until the earliest due time or lease
deadline of its shards, and ingress wakes it early when it stores an earlier record.
"""

from __future__ import annotations

import bisect
import functools
import logging
import operator
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError as ClientError
from confluent_kafka import KafkaException, Message, Producer

from bridge.catchup import CatchUp
from bridge.errors import StoreError, WriteRefused
from bridge.health import Readiness
from bridge.kafka import produce
from bridge.message import (
    Reason,
    Scheduled,
    dead_letter_headers,
    origin,
    wire_headers,
)
from bridge.metrics import Metrics
from bridge.store import Claimed, Claims, Shard, Store

logger = logging.getLogger(__name__)

PERMANENT_ERRORS = frozenset(
    {
        ClientError.UNKNOWN_TOPIC_OR_PART,
        ClientError._UNKNOWN_TOPIC,
        ClientError._UNKNOWN_PARTITION,
        ClientError.MSG_SIZE_TOO_LARGE,
        ClientError.RECORD_LIST_TOO_LARGE,
        ClientError.TOPIC_AUTHORIZATION_FAILED,
        ClientError.CLUSTER_AUTHORIZATION_FAILED,
        ClientError.TOPIC_EXCEPTION,
        ClientError.INVALID_RECORD,
        ClientError._INVALID_ARG,
    }
)
IDLE_WAIT_S = 5.0  # a safety net only: wake-ups come from due times and ingress
NEVER = float("inf")
HOLD_WAIT_S = 0.05  # the longest sleep while due records wait for a catching-up ingress
INFLIGHT_POLL_S = 0.05
# Redis failures: the mover waits this long, doubling per failure in a row up to the cap.
ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S = 0.25, 2.0
# A record whose delivery failed is claimable again after this long, doubling per failure.
RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS = 500, 5_000
RETRIES_KEPT = 100_000  # failure counts remembered (records another replica took are forgotten)
# The sender produces records claimed ahead about this many at a time while they keep falling
# due: every wake-up costs librdkafka a produce request per target partition it touches, so the
# sender waits up to the claim tick when records fall due slowly (20 a tick at 2,000/s) and as
# little as the send tick when they come fast (every 2 ms at 10,000/s).
SEND_BATCH = 20
_DUE = operator.itemgetter(0)  # of a held record: (due ms, record)


def backoff(base: float, cap: float, failures: int) -> float:
    """``base`` doubled per failure after the first, at most ``cap``."""
    return float(min(cap, base * 2 ** min(max(failures - 1, 0), 30)))


@dataclass(slots=True)
class _Pending:
    claimed: Claimed
    attempts: int = 0
    dead_letter: bool = False
    error: str = ""  # Kafka's last refusal, for the DLQ's delay-error-detail


@dataclass
class _Acked:
    """A shard's delivered records whose acknowledgement Redis has not applied yet."""

    members: list[bytes] = field(default_factory=list)
    ids: list[tuple[str, bytes]] = field(default_factory=list)  # those in the id index
    delivered: list[tuple[_Pending, int]] = field(default_factory=list)  # with the report's time


def _by_shard(idents: Iterable[tuple[Shard, bytes]]) -> dict[Shard, list[bytes]]:
    """Records (shard, member) grouped by shard, as the store's calls take them."""
    grouped: dict[Shard, list[bytes]] = defaultdict(list)
    for shard, member in idents:
        grouped[shard].append(member)
    return grouped


class Egress:
    """The mover. Runs in one thread; delivery reports are served on that thread."""

    def __init__(
        self,
        producer: Producer,
        store: Store,
        metrics: Metrics,
        *,
        dead_letter: str,
        batch_size: int,
        lease_ms: int,
        max_attempts: int,
        tick_ms: int = 0,
        send_tick_ms: int | None = None,
        ahead_ms: int = 0,
        readiness: Readiness | None = None,
        catch_up: CatchUp | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.producer = producer
        self.catch_up = catch_up or CatchUp()
        self.readiness = readiness or Readiness()
        self.store = store
        self.metrics = metrics
        self.dead_letter = dead_letter
        self.batch_size = batch_size
        self.lease_ms = lease_ms
        self.max_attempts = max_attempts
        self.tick_ms = tick_ms
        # Records claimed ahead are produced at most once per send tick (the tick when None), and
        # at most once per _send_every_ms: SEND_BATCH records' worth at the rate they fall due.
        self.send_tick_ms = tick_ms if send_tick_ms is None else send_tick_ms
        self._send_every_max_ms = float(max(tick_ms, self.send_tick_ms))
        self._send_every_ms = self._send_every_max_ms
        self.ahead_ms = ahead_ms
        # Delivered records are acknowledged with their shard's next claim or after this long:
        # with claims ahead, a claim comes every half window.
        self._ack_wait_ms = max(tick_ms, ahead_ms // 2)
        # Records claimed ahead of their due time (see claim.lua), produced from memory when due:
        # (due ms, record), sorted by due time, earlier claims first among equals; they are in
        # _pending too. A claim's records come in runs already sorted, so a stable sort merges
        # them in, and the due ones leave as one slice — not a heap operation per record. The
        # sender thread (send_when_due) produces them, so a claim's round trip does not hold
        # them up.
        self._held: list[tuple[int, tuple[Shard, bytes]]] = []
        self._held_sent_ms = 0.0  # Redis ms: when held records were last produced
        self._held_lock = threading.Lock()
        self._held_wake = threading.Event()  # a record earlier than the sender's plan was held
        self._clock_ms = clock_ms
        # When each owned shard is claimed from next, on Redis's clock (from its last claim's
        # reply), and the earliest moment the tick allows; absent: unknown, claim at once.
        self._next_ms: dict[Shard, float] = {}
        self._not_before_ms: dict[Shard, float] = {}
        self._redis_minus_local_ms: float | None = None  # Redis's clock - time.monotonic()
        self._stored: dict[Shard, int] = {}  # earliest due time ingress stored since the last step
        self.owned: frozenset[Shard] = frozenset()
        self._wake = threading.Event()
        self._pending: dict[tuple[Shard, bytes], _Pending] = {}
        # Delivery reports not applied yet: (record, error, epoch ms when it came in). Appended
        # by whichever thread polls the producer, taken from the left by the mover.
        self._reports: deque[tuple[tuple[Shard, bytes], ClientError | None, int]] = deque()
        # Delivered records per shard, acknowledged in Redis with the shard's next claim or, at the
        # latest, at _ack_by (monotonic s): one call takes a tick's worth.
        self._acked: dict[Shard, _Acked] = {}
        self._ack_by: float | None = None
        # Failed deliveries in a row per record, for its back-off; dropped when it is delivered.
        self._retries: dict[tuple[Shard, bytes], int] = {}
        # Shards assigned since the last step: their earlier owner's leases end first.
        self._taking_over: set[Shard] = set()
        self._lock = threading.Lock()
        # Notified whenever in-flight records settle; revocation waits on it.
        self._settled = threading.Condition()
        self.last_loop = time.monotonic()
        self.sender_last_loop = self.last_loop

    # -------------------------------------------------------------- called from ingress

    def add_shards(self, shards: set[Shard]) -> None:
        """Start moving records of newly assigned partitions; the leases their earlier owner
        left end before the first claim (see take_over.lua)."""
        with self._lock:
            self._taking_over |= shards
        self.owned = self.owned | shards
        self._wake.set()

    def remove_shards(self, shards: set[Shard]) -> None:
        """Stop claiming from revoked partitions and their retired incarnations (in-flight
        records still get acknowledged)."""
        gone = {s.base() for s in shards}
        with self._lock:
            self._taking_over = {s for s in self._taking_over if s.base() not in gone}
        self.owned = frozenset(s for s in self.owned if s.base() not in gone)

    def settle(self, shards: set[Shard], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no record of these partitions is in flight, so their
        next owner, which ends the leases it finds, does not deliver them again; returns how many
        are still in flight (their next owner may duplicate them). Called by the consumer's
        thread while the mover runs."""
        gone = {s.base() for s in shards}

        def left() -> int:
            # list() copies the keys in one step, while the mover's thread may change the dict
            return sum(1 for s, _ in list(self._pending) if s.base() in gone)

        with self._settled:
            self._settled.wait_for(lambda: left() == 0, timeout_s)
            return left()

    def notify(self, earliest: Mapping[Shard, int]) -> None:
        """Ingress stored records due from these times on; wake up in case one is sooner than
        planned."""
        with self._lock:
            for shard, due_ms in earliest.items():
                self._stored[shard] = min(due_ms, self._stored.get(shard, due_ms))
        self._wake.set()

    def wake_up(self) -> None:
        """Cut the mover's and the sender's sleep short (stopping)."""
        self._wake.set()
        self._held_wake.set()

    # -------------------------------------------------------------- the loop

    @property
    def max_inflight(self) -> int:
        """Records produced and unacknowledged at most: claims stop there. Ten batches keep the
        producer busy while delivery reports of earlier ones come back (two cost 13% of the
        end-to-end rate in `make bench`); all are leased, so a crash redelivers at most this
        many."""
        return self.batch_size * 10

    @property
    def inflight(self) -> int:
        """Records produced and not yet acknowledged."""
        return len(self._pending)

    def step(self, now_ms: int | None = None) -> int:
        """Serve delivery reports, then claim and produce what is due. Returns records claimed.

        ``now_ms`` replaces Redis's clock for the claim (tests); the loop passes None.
        """
        self.last_loop = time.monotonic()
        self.producer.poll(0)
        self._settle()
        if self._taking_over:
            self._take_over()
        self._merge_stored()
        now = self._redis_now_ms() if now_ms is None else now_ms
        self._send_held(now)
        room = self.max_inflight - len(self._pending)
        shards = self._to_claim(now)
        if not shards or room <= 0:
            self._ack()
            return 0
        per_shard = max(1, min(self.batch_size, room // len(shards)))
        horizons = self.catch_up.horizons()
        # The acknowledgements of a shard claimed from go along in its claim's call.
        acks = {s: self._acked[s] for s in shards if s in self._acked}
        claimed = self.store.claim(
            shards, per_shard, self.lease_ms, now_ms, horizons, ahead_ms=self.ahead_ms,
            acks={s: a.members for s, a in acks.items()}, ids={s: a.ids for s, a in acks.items()},
        )  # fmt: skip
        self._acknowledged(acks)
        self._ack()
        self._plan(claimed, per_shard, horizons)
        put_back = self._put_back_past_horizon(claimed)
        redelivered = 0
        held: list[tuple[int, tuple[Shard, bytes]]] = []
        for item in claimed:
            ident = (item.shard, item.member)
            if ident in put_back:
                continue
            redelivered += item.redelivery
            pending = self._pending.get(ident)
            if pending is None:
                pending = self._pending[ident] = _Pending(item)
            if item.record.due_ms > claimed.now_ms:
                held.append((item.record.due_ms, ident))
            else:
                self._send(ident, pending)
        self._hold(held)
        if redelivered:
            self.metrics.redelivered.inc(redelivered)
        self.producer.poll(0)
        return len(claimed)

    def _put_back_past_horizon(self, claims: Claims) -> set[tuple[Shard, bytes]]:
        """The ingress may begin catching up on a partition after the mover read the horizons
        and before Redis ran its claim (it re-reads after Redis lost its state, or a partition is
        assigned): a cancel may then sit in the part of the log it has yet to read. Records
        claimed past the horizon such a catch-up set are not produced: they go back among the
        waiting ones, where a cancel reaches them, until the horizon passes them. (A lease that
        ran out is not: its record was claimed before, and a claimed record is past cancel.)
        Returns them."""
        horizons = self.catch_up.horizons()
        if not horizons:
            return set()
        past = [c for c in claims
                if c.shard in horizons and c.record.due_ms > horizons[c.shard]
                and not c.redelivery and (c.shard, c.member) not in self._pending]  # fmt: skip
        if past:
            self.store.unclaim(past)
            for shard in {c.shard for c in past}:
                self._not_before_ms[shard] = claims.now_ms + HOLD_WAIT_S * 1000
            logger.info("%d records claimed as a catch-up began wait for it", len(past))
        return {(c.shard, c.member) for c in past}

    def not_due(self, now_ms: int) -> int:
        """Records claimed ahead that are not due by ``now_ms`` (read by the metrics thread)."""
        held = list(self._held)
        return len(held) - bisect.bisect_right(held, now_ms, key=_DUE)

    def send_when_due(self, stop: threading.Event) -> None:
        """The sender thread: produce records claimed ahead at their due time (about SEND_BATCH at
        a time, see :meth:`_seconds_to_held`) until ``stop`` is set, serving delivery reports as
        it goes. The mover's claims — a round trip to Redis and the decoding of what it returns,
        tens of ms at high rates — would otherwise hold up every record falling due meanwhile."""
        while not stop.is_set():
            self.sender_last_loop = time.monotonic()
            self._held_wake.clear()  # before looking: a record held from here on wakes it
            if self._redis_minus_local_ms is not None:  # nothing is held before a claim
                self._send_held(self._redis_now_ms())
            self.producer.poll(0)
            self._held_wake.wait(self._seconds_to_held())

    def _hold(self, held: list[tuple[int, tuple[Shard, bytes]]]) -> None:
        """Keep records claimed ahead until their due time; wake the sender if one is due
        before what it waits for."""
        if not held:
            return
        with self._held_lock:
            first = self._held[0][0] if self._held else NEVER
            self._held.extend(held)
            self._held.sort(key=_DUE)
            sooner = self._held[0][0] < first
        if sooner:
            self._held_wake.set()

    def _send_held(self, now_ms: float) -> None:
        """Produce the records claimed ahead whose due time has come (by Redis's clock)."""
        with self._held_lock:  # both threads send: the mover after a claim, and the sender
            count = bisect.bisect_right(self._held, now_ms, key=_DUE)
            if not count:
                return
            due = self._held[:count]
            del self._held[:count]
            gap = now_ms - self._held_sent_ms
            if gap > 2 * self._send_every_max_ms:  # after a quiet spell: no rate to go by
                self._send_every_ms = self.send_tick_ms
            else:
                every = gap * SEND_BATCH / len(due)
                self._send_every_ms = min(self._send_every_max_ms, max(self.send_tick_ms, every))
            self._held_sent_ms = now_ms
        for _, ident in due:
            pending = self._pending.get(ident)
            if pending is not None:
                self._send(ident, pending)

    def _seconds_to_held(self) -> float:
        """Until the first held record is due, but no sooner than SEND_BATCH records' worth (at
        least a send tick, at most a tick) after the last were sent; at most IDLE_WAIT_S."""
        with self._held_lock:  # the mover may send the last of them meanwhile
            first = self._held[0][0] if self._held else None
        if first is None or self._redis_minus_local_ms is None:
            return IDLE_WAIT_S
        at = max(first, self._held_sent_ms + self._send_every_ms)
        return min(IDLE_WAIT_S, max(0.0, (at - self._redis_now_ms()) / 1000))

    def _release_held(self) -> None:
        """End the leases of records claimed ahead and not produced (shutdown): the next owner
        claims them at once."""
        with self._held_lock:
            released = _by_shard(ident for _, ident in self._held)
            self._held.clear()
        if not released:
            return
        try:
            self.store.release(released)
        except StoreError as exc:  # their leases run out instead; the in-flight rest still drains
            logger.warning("records claimed ahead not released (%s); their leases will expire", exc)
        self._forget(released)

    def _redis_now_ms(self) -> float:
        """Redis's clock as of the last claim, carried on by the local monotonic clock
        (slightly behind Redis's by the reply's trip: the mover wakes late, never early)."""
        if self._redis_minus_local_ms is None:
            return NEVER  # nothing claimed yet: every shard is due for a claim
        return time.monotonic() * 1000 + self._redis_minus_local_ms

    def _to_claim(self, now: float) -> list[Shard]:
        """The shards to claim from at ``now``: none unless one's claim is due; then every shard
        not held back (by a tick or a catch-up) whose next claim is at most half an ``ahead``
        window away — one Redis call for them all, rather than one per shard as their plans drift
        apart (without claims ahead, exactly the due ones). A shard claimed a little before its
        plan takes records due within the same window of now, none before their due time."""
        owned = sorted(self.owned)
        if not any(self._claim_at(s) <= now for s in owned):
            return []
        soon = now + self.ahead_ms / 2
        return [
            s for s in owned
            if self._not_before_ms.get(s, 0.0) <= now and self._next_ms.get(s, 0.0) <= soon
        ]  # fmt: skip

    def _claim_at(self, shard: Shard) -> float:
        """When ``shard`` is claimed from next (0: at once)."""
        return max(self._next_ms.get(shard, 0.0), self._not_before_ms.get(shard, 0.0))

    def _merge_stored(self) -> None:
        """Records ingress stored meanwhile may fall due before a shard's planned claim."""
        if not self._stored:
            return
        with self._lock:
            stored, self._stored = self._stored, {}
        horizons = self.catch_up.horizons()
        for shard, due_ms in stored.items():
            if shard in self._next_ms:
                self._next_ms[shard] = min(self._next_ms[shard], due_ms - self.ahead_ms)
            if shard in horizons:  # its horizon moved with the batch: what it releases goes now
                self._not_before_ms.pop(shard, None)

    def _plan(self, claims: Claims, per_shard: int, horizons: Mapping[Shard, int]) -> None:
        """When to claim from each shard again: at once while a claim comes back full (a
        backlog), else at its next due time or lease deadline — but, while records keep falling
        due, no sooner than a tick after this claim, so one call takes a tick's worth of them."""
        self._redis_minus_local_ms = claims.clock_ms - claims.received * 1000
        got = Counter(item.shard for item in claims)
        for shard, next_ms in claims.next_ms.items():
            if got[shard] >= per_shard:
                self._next_ms[shard], self._not_before_ms[shard] = claims.now_ms, 0.0
                continue
            # Nothing left: look again after IDLE_WAIT_S anyway (a safety net; ingress wakes
            # the mover for what it stores).
            idle = claims.now_ms + IDLE_WAIT_S * 1000
            plan = idle if next_ms is None else next_ms
            if self.ahead_ms:
                # Records are claimed ahead: look again when the next one comes within reach,
                # or half a window on while they keep coming (a record with its own delay-id
                # is claimed at its due time, as without).
                plan = min(plan, max(plan - self.ahead_ms, claims.now_ms + self.ahead_ms / 2))
            self._next_ms[shard] = plan
            self._not_before_ms[shard] = claims.now_ms + self.tick_ms if got[shard] else 0.0
            if shard in horizons:
                # Due records may wait for the ingress's horizon: the ingress wakes the mover
                # with every batch it stores, and this keeps a due one from turning the loop hot.
                self._not_before_ms[shard] = claims.now_ms + HOLD_WAIT_S * 1000
            if next_ms is None and shard.incarnation and not got[shard]:
                self._forget_if_drained(shard)

    def _claim_again(self, members: Mapping[Shard, Sequence[bytes]], wait_ms: int) -> None:
        """Released records are claimable after ``wait_ms``: plan their shards' next claim then,
        not when their leases would have run out."""
        retry_at = self._redis_now_ms() + wait_ms  # released after a claim: the clock is known
        for shard in members:
            self._next_ms[shard] = min(self._next_ms.get(shard, NEVER), retry_at)

    def _forget_if_drained(self, shard: Shard) -> None:
        if self.store.forget_retired(shard):  # nothing left of that incarnation
            logger.info("delivered every record left in %s", shard)
            self.owned = self.owned - {shard}
            self._next_ms.pop(shard, None)
            self._not_before_ms.pop(shard, None)

    def _take_over(self) -> None:
        with self._lock:
            shards, self._taking_over = self._taking_over, set()
        for shard in shards:  # nothing known of them yet: claim at once
            self._next_ms.pop(shard, None)
            self._not_before_ms.pop(shard, None)
        held: dict[Shard, list[bytes]] = {s: [] for s in shards}
        for shard, member in self._pending:
            if shard in held:
                held[shard].append(member)
        try:
            ended = self.store.take_over(held)
        except StoreError:
            with self._lock:
                self._taking_over |= shards & self.owned
            raise
        if ended:
            logger.info("took back %d leases an earlier owner of %s left", ended,
                        ", ".join(str(s) for s in sorted(shards)))  # fmt: skip

    def run(self, stop: threading.Event) -> None:
        """Move records until ``stop`` is set, then drain what is in flight."""
        failures = 0
        while not stop.is_set():
            try:
                self.step()
                if failures:
                    failures = 0
                    self.readiness.ok("mover")
                    logger.info("mover reaches redis again")
                if self.inflight >= self.max_inflight:
                    # At capacity: poll returns as soon as the first delivery report is in.
                    self.producer.poll(INFLIGHT_POLL_S)
                    continue
                self._wait(self._seconds_to_next())
            except StoreError as exc:
                failures += 1
                wait = backoff(ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S, failures)
                self.metrics.redis_errors.labels(stage="egress").inc()
                self.readiness.fail("mover", f"mover cannot claim or acknowledge records: {exc}",
                                    write_refused=isinstance(exc, WriteRefused))  # fmt: skip
                logger.error("mover backing off %.1fs: %s", wait, exc)
                stop.wait(wait)

    def _seconds_to_next(self) -> float:
        """Until the first owned shard is to be claimed from or the delivery reports applied
        (at most IDLE_WAIT_S)."""
        if self._stored or self._taking_over:
            return 0.0
        seconds = IDLE_WAIT_S
        if self._ack_by is not None:
            seconds = min(seconds, max(0.0, self._ack_by - time.monotonic()))
        first = min((self._claim_at(s) for s in self.owned), default=NEVER)
        if first != NEVER:
            seconds = min(seconds, max(0.0, (first - self._redis_now_ms()) / 1000))
        return seconds

    def _wait(self, seconds: float) -> None:
        if self._pending and not self.tick_ms:
            # Delivery reports arrive through poll, which returns at the first; keep the slice
            # short so an earlier record stored meanwhile by ingress is not held up long.
            self.producer.poll(min(seconds, INFLIGHT_POLL_S))
            return
        if self._pending:
            # Reports are applied once per tick anyway: collect them at the next step (poll(0))
            # instead of waking for each one. While the sender has records to produce it polls
            # too: the mover then applies them at most half an ``ahead`` window later.
            seconds = min(seconds, (self._ack_wait_ms if self._held else self.tick_ms) / 1000)
        if seconds > 0:
            self._wake.wait(seconds)
            self._wake.clear()

    def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for in-flight deliveries; release the unacknowledged rest."""
        deadline = time.monotonic() + timeout_s
        self._release_held()
        while self._pending and time.monotonic() < deadline:
            self.producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            self._settle()
            self._ack(force=True)
        if self._pending:
            released = _by_shard(self._pending)
            logger.warning(
                "%d records unacknowledged at shutdown; leases released", len(self._pending)
            )
            self.store.release(released)
            self._pending.clear()
            with self._settled:
                self._settled.notify_all()

    # -------------------------------------------------------------- produce and settle

    def _send(self, ident: tuple[Shard, bytes], pending: _Pending) -> None:
        record = pending.claimed.record
        callback = functools.partial(self._on_delivery, ident)
        if pending.dead_letter:
            topic, key, headers = self.dead_letter, record.key, self._dlq_headers(pending)
        else:
            topic, key, headers = record.target, record.delivered_key(), record.delivered_headers()
        # The producer stamps the record; never earlier than the due time, whatever the local clock.
        timestamp = max(self._clock_ms(), record.due_ms)
        try:
            produce(
                self.producer, topic, value=record.value, key=key, headers=wire_headers(headers),
                timestamp=timestamp, on_delivery=callback,
            )  # fmt: skip
        except KafkaException as exc:
            # Refused locally (e.g. larger than message.max.bytes): same path as a report.
            self._reports.append((ident, exc.args[0], self._clock_ms()))

    def _dlq_headers(self, pending: _Pending) -> list[tuple[str, bytes | None]]:
        record = pending.claimed.record
        shard = pending.claimed.shard
        return dead_letter_headers(
            record.headers,
            Reason.DELIVERY_FAILED,
            f"delivery to {record.target} failed {pending.attempts} times: {pending.error}",
            origin(shard.topic, shard.partition, record.offset),
        )

    def _on_delivery(
        self, ident: tuple[Shard, bytes], err: ClientError | None, _msg: Message
    ) -> None:
        self._reports.append((ident, err, self._clock_ms()))

    def _settle(self) -> None:
        """Take in delivery reports: successes wait to be acknowledged (see :meth:`_ack`),
        failures are retried or dead-lettered."""
        if not self._reports:
            return
        reports = [self._reports.popleft() for _ in range(len(self._reports))]
        retry: dict[int, dict[Shard, list[bytes]]] = defaultdict(lambda: defaultdict(list))
        failed: Counter[tuple[str, str, int]] = Counter()
        for ident, err, at_ms in reports:
            pending = self._pending.get(ident)
            if pending is None:
                continue  # a second report for a record delivered twice after a lease expiry
            if err is None:
                acked = self._acked.get(ident[0])
                if acked is None:  # not setdefault: that builds an _Acked per record
                    acked = self._acked[ident[0]] = _Acked()
                acked.members.append(ident[1])
                given = pending.claimed.given_id()
                if given is not None:
                    acked.ids.append((given, ident[1]))
                acked.delivered.append((pending, at_ms))
                self._retries.pop(ident, None)
                if self._ack_by is None:  # counted from when the report came in
                    waited_ms = max(0, self._clock_ms() - at_ms)
                    self._ack_by = time.monotonic() + (self._ack_wait_ms - waited_ms) / 1000
                continue
            if err.code() in PERMANENT_ERRORS and not pending.dead_letter:
                pending.attempts += 1
                pending.error = f"{err.name()}: {err.str()}"
                if pending.attempts >= self.max_attempts:
                    pending.dead_letter = True
                    logger.warning(
                        "delivery of %s to %s failed %d times (%s); dead-lettering",
                        pending.claimed.record.delay_id, pending.claimed.record.target,
                        pending.attempts, err.str(),
                    )  # fmt: skip
                self._send(ident, pending)
                continue
            topic = self.dead_letter if pending.dead_letter else pending.claimed.record.target
            if len(self._retries) >= RETRIES_KEPT:
                self._retries.clear()
            tries = self._retries[ident] = self._retries.get(ident, 0) + 1
            wait_ms = int(backoff(RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS, tries))
            retry[wait_ms][ident[0]].append(ident[1])
            failed[(topic, err.str(), wait_ms)] += 1
        for wait_ms, members in retry.items():
            self.store.release(members, wait_ms)
            self._forget(members)
            self._claim_again(members, wait_ms)
        self._report_failures(failed)

    def _ack(self, force: bool = False) -> None:
        """Acknowledge delivered records in Redis: a tick (or half an ``ahead`` window) after the
        first report came in, at once when ``force`` or at capacity (claims of their shards take
        them along sooner)."""
        if not self._acked:
            return
        waiting = self._ack_by is not None and time.monotonic() < self._ack_by
        if waiting and not force and self.inflight < self.max_inflight:
            return
        acks = self._acked
        self.store.ack({s: a.members for s, a in acks.items()}, {s: a.ids for s, a in acks.items()})
        self._acknowledged(acks)

    def _acknowledged(self, acks: Mapping[Shard, _Acked]) -> None:
        """Redis applied ``acks``: forget and count their records."""
        if not acks:
            return
        self._forget({shard: a.members for shard, a in acks.items()})
        self._count([d for a in acks.values() for d in a.delivered])
        self._acked = {s: a for s, a in self._acked.items() if s not in acks}
        if not self._acked:
            self._ack_by = None

    def _report_failures(self, failed: Counter[tuple[str, str, int]]) -> None:
        """One line per topic and error; a DLQ that refuses records also fails /readyz."""
        for (topic, error, wait_ms), n in sorted(failed.items()):
            if topic == self.dead_letter:
                self.metrics.dlq_errors.inc(n)
                self.readiness.fail("dlq-writes", f"DLQ produce to {topic} failed: {error}")
            logger.warning("%d deliveries to %s failed (%s); retrying in %.1fs", n, topic, error,
                           wait_ms / 1000)  # fmt: skip

    def _forget(self, members: dict[Shard, list[bytes]]) -> None:
        for shard, batch in members.items():
            for m in batch:
                self._pending.pop((shard, m), None)
        with self._settled:
            self._settled.notify_all()

    def _count(self, delivered: list[tuple[_Pending, int]]) -> None:
        """Count a batch of acknowledged records (with when each report came in): one label
        lookup per target, not per record."""
        per_target: Counter[str] = Counter()
        late_s: list[float] = []
        dead_lettered = 0
        for pending, now_ms in delivered:
            record: Scheduled = pending.claimed.record
            if pending.dead_letter:
                dead_lettered += 1
                continue
            per_target[record.target] += 1
            late_s.append(max(0, now_ms - record.late_from_ms()) / 1000)
        self.metrics.lateness.observe_many(late_s)
        for target, n in per_target.items():
            self.metrics.delivered.labels(target_topic=target).inc(n)
        if dead_lettered:
            self.metrics.dead_lettered.labels(reason=Reason.DELIVERY_FAILED.value).inc(
                dead_lettered
            )
            self.readiness.ok("dlq-writes")
