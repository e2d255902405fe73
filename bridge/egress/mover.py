"""The mover: claims due records from the owned shards and hands them to be produced.

It sleeps until the earliest due time or lease deadline of its shards (:mod:`.plan`), and ingress
wakes it early when it stores an earlier record. Records claimed ahead wait in memory for their
due time (:mod:`.sender`); delivery reports settle what was produced (:mod:`.settle`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Producer

from bridge.catchup import CatchUp
from bridge.config import EgressConfig
from bridge.egress.lanes import Lanes, lanes_min
from bridge.egress.plan import HOLD_WAIT_S, IDLE_WAIT_S, NEVER, Plan, RedisClock
from bridge.egress.rate import RateLimit, TargetLimits
from bridge.egress.sender import Sender
from bridge.egress.settle import Deliveries, Ident, InFlight, backoff
from bridge.errors import StoreError, WriteRefused, log_failed_turn
from bridge.health import Readiness
from bridge.metrics import Metrics
from bridge.store import Claimed, Claims, Shard, Store
from bridge.turns import Turns

logger = logging.getLogger(__name__)

INFLIGHT_POLL_S = 0.05
# Redis failures: the mover waits this long, doubling per failure in a row up to the cap.
ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S = 0.25, 2.0


# The six "fmt: skip" lines in this class keep it within the structure test's 300 lines, ruff
# laying them out would take 26 more; the egress re-cut (one owner of in-flight state) is to
# shrink it first. They are the only ones in bridge/.
class Egress:
    """The mover. Runs in one thread; delivery reports are served on that thread."""

    def __init__(
        self,
        producer: Producer,
        store: Store,
        metrics: Metrics,
        config: EgressConfig,
        *,
        dead_letter: str,
        readiness: Readiness | None = None,
        catch_up: CatchUp | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.producer = producer
        self.catch_up = catch_up or CatchUp()
        self.readiness = readiness or Readiness()
        self.store = store
        self.metrics = metrics
        self.batch_size = config.batch_size
        self.lease_ms = lease_ms = config.lease
        self.tick_ms = tick_ms = config.tick
        self.ahead_ms = ahead_ms = config.ahead
        # Delivered records are acknowledged with their shard's next claim or after this long:
        # with claims ahead, a claim comes every half window.
        self._ack_wait_ms = max(tick_ms, ahead_ms // 2)
        self.clock = RedisClock()
        self.plan = Plan(tick_ms, ahead_ms)
        self.deliveries = Deliveries(
            producer, store, metrics, self.readiness, dead_letter=dead_letter,
            max_attempts=config.max_attempts, ack_wait_ms=self._ack_wait_ms, clock_ms=clock_ms,
            send=self._send, on_retry=self._claim_again,
        )  # fmt: skip
        self.sender = Sender(
            tick_ms, config.send_tick, clock=self.clock,
            deliveries=self.deliveries, send=self._send, producer=producer, store=store,
        )  # fmt: skip
        self.lanes = Lanes(self.deliveries.draining)
        self.rate = RateLimit(config.max_rate) if config.max_rate else None
        self.targets = TargetLimits(store, metrics, config.max_rate_per_target, lease_ms)
        self._starved = False  # the last step claimed nothing for want of the rate's tokens
        # The earliest due time of each lane ingress stored since the last step.
        self._stored: dict[Shard, tuple[int, int, int]] = {}
        self.owned: frozenset[Shard] = frozenset()
        self._wake = threading.Event()
        # Shards assigned since the last step: their earlier owner's leases end first.
        self._taking_over: set[Shard] = set()
        self._lock = threading.Lock()
        self.last_loop = time.monotonic()
        self.turns = Turns("mover")

    def add_shards(self, shards: set[Shard]) -> None:
        """Start moving records of newly assigned partitions; the leases their earlier owner
        left end before the first claim (see take_over.lua)."""
        with self._lock:
            self._taking_over |= shards
        self.owned = self.owned | shards
        self._wake.set()

    def remove_shards(self, shards: set[Shard]) -> None:
        """Stop claiming from revoked partitions and their retired incarnations."""
        gone = {s.base() for s in shards}
        with self._lock:
            self._taking_over = {s for s in self._taking_over if s.base() not in gone}
        self.owned = frozenset(s for s in self.owned if s.base() not in gone)
        self.targets.forget(self.owned)

    def wait_settled(self, shards: set[Shard], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no record of these partitions is in flight, so their
        next owner, which ends the leases it finds, does not deliver them again; returns how many
        are still in flight (their next owner may duplicate them). Called by the consumer's
        thread while the mover runs."""
        return self.deliveries.wait_settled(shards, timeout_s)

    def notify(self, earliest: Mapping[Shard, tuple[int, int, int]]) -> None:
        """Ingress stored records due from these times on (the earliest of each priority lane,
        -1: none); wake up in case one is sooner than planned."""
        with self._lock:
            for shard, lanes in earliest.items():
                self._stored[shard] = lanes_min(lanes, self._stored.get(shard, lanes))
        self._wake.set()

    def wake_up(self) -> None:
        """Cut the mover's and the sender's sleep short (stopping)."""
        self._wake.set()
        self.sender.wake.set()

    @property
    def max_inflight(self) -> int:
        """Records produced and unacknowledged at most: claims stop there. Ten batches keep the
        producer busy while delivery reports of earlier ones come back (fewer cost throughput:
        docs/bench/history.md); all are leased, so a crash redelivers at most this many."""
        return self.batch_size * 10

    @property
    def inflight(self) -> int:
        """Records produced and not yet acknowledged."""
        return len(self.deliveries.in_flight)

    def step(self, now_ms: int | None = None) -> int:
        """Serve delivery reports, then claim and produce what is due. Returns the records claimed
        and kept (not put back, nor set aside for their target's rate).

        ``now_ms`` replaces Redis's clock for the claim (tests); the loop passes None.
        """
        self.last_loop = time.monotonic()
        self.producer.poll(0)
        self.deliveries.apply_reports()
        self.deliveries.watch()
        self.turns.mark("applying delivery reports")
        if self._taking_over:
            self._take_over()
        if self._stored:
            with self._lock:
                stored, self._stored = self._stored, {}
            self.plan.stored(self.lanes.stored(stored), self.catch_up.horizons())
        now = self.clock.now_ms() if now_ms is None else now_ms
        self.sender.send_due(now)
        self.turns.mark("producing held records")
        room = self.max_inflight - len(self.deliveries.in_flight)
        limited = False  # egress.max_rate leaves less room than the records in flight do
        if self.rate is not None:
            allowed = self.rate.allowance()
            limited, room = allowed < room, min(room, allowed)
        self.lanes.release(self.owned, self.plan)
        shards = self.plan.to_claim(self.owned, now)
        self._starved = bool(shards) and limited and room <= 0
        claimed = 0
        if shards and room > 0:
            claimed = self._claim(shards, room, now, now_ms, limited)
        else:
            self._ack()
        if self.targets.waiting and room > claimed:
            claimed += self._claim_waiting(now, now_ms, room - claimed)
        self.producer.poll(0)
        self.turns.mark("producing claimed records")
        return claimed

    def _claim(self, shards: list[Shard], room: int, now: float, now_ms: int | None,
               limited: bool) -> int:  # fmt: skip
        """Claim from the due indexes of ``shards`` and produce what is due; returns how many
        records it took (not those put back or set aside for their target's rate)."""
        per_shard = max(1, min(self.batch_size, room // len(shards)))
        horizons = self.catch_up.horizons()
        # The acknowledgements of a shard claimed from go along in its claim's call.
        acked = self.deliveries.acked
        acks = {s: acked[s] for s in shards if s in acked}
        claimed = self.store.claim(
            shards, per_shard, self.lease_ms, now_ms, horizons, ahead_ms=self.ahead_ms,
            acks={s: a.members for s, a in acks.items()}, ids={s: a.ids for s, a in acks.items()},
            epochs={s: a.epoch for s, a in acks.items()}, lanes=self.lanes.limits(shards),
            ahead_lanes=self.lanes.ahead(self.owned, now + self.ahead_ms),
            watermarks=self.catch_up.watermarks(),
        )  # fmt: skip
        self.turns.mark("claiming from redis")
        self.deliveries.acknowledged(acks)
        self._ack()
        self.clock.set(claimed)
        for shard in self.plan.claimed(claimed, per_shard, horizons):
            self._forget_if_drained(shard)
        backlog = self.lanes.claimed(claimed, self.plan)  # after the plan: it may hold some back
        put_back = self._put_back(
            claimed, self.lanes.too_low(claimed, self.deliveries.in_flight, backlog)
        )
        put_back |= self.targets.hold(claimed, self.deliveries.in_flight, put_back)
        if self.rate is not None:
            self.rate.count(claimed, self.metrics if limited else None, put_back)
        self.sender.dispatch(claimed, put_back, backlog)
        return len(claimed) - len(put_back)

    def _claim_waiting(self, now: float, now_ms: int | None, room: int) -> int:
        """Claim from the wait indexes what the rate-limited targets' rates allow now."""
        got = self.targets.claim(now, now_ms, room, self.catch_up, self.batch_size)
        for claims in got:
            if self.rate is not None:
                self.rate.take(len(claims))
            self.sender.dispatch(claims, set(), None)
        return sum(len(c) for c in got)

    def _send(self, ident: Ident, inflight: InFlight) -> None:
        """Produce a claimed record: the one place every record leaves by."""
        self.deliveries.produce(ident, inflight)

    def _ack(self, force: bool = False) -> None:
        self.deliveries.ack(force or self.inflight >= self.max_inflight)

    def _put_back(self, claims: Claims, too_low: list[Claimed]) -> set[Ident]:
        """Records claimed that are not to be produced yet go back among the waiting ones, as if
        never claimed; returns them: ``too_low`` (:meth:`Lanes.too_low`), and those past a
        catch-up's horizon (:meth:`CatchUp.past`)."""
        past = self.catch_up.past(claims, self.deliveries.in_flight)
        back = {(c.shard, c.member): c for c in (*past, *too_low)}
        if back:
            self.store.unclaim(back.values())
            self.plan.hold_back({s for s, _ in back}, claims.now_ms + HOLD_WAIT_S * 1000)
        return set(back)

    def _claim_again(self, members: Mapping[Shard, Sequence[bytes]], wait_ms: int) -> None:
        """Released records are claimable after ``wait_ms``: plan their shards' next claim then,
        not when their leases would have run out."""
        self.plan.claim_again(members, self.clock.now_ms() + wait_ms)  # released after a claim

    def _forget_if_drained(self, shard: Shard) -> None:
        if self.store.layout.forget_retired(shard):  # nothing left of that incarnation
            logger.info("delivered every record left in %s", shard)
            self.owned = self.owned - {shard}
            self.plan.forget([shard])

    def _take_over(self) -> None:
        with self._lock:
            shards, self._taking_over = self._taking_over, set()
        self.plan.forget(shards)  # nothing known of them yet: claim at once
        held: dict[Shard, list[bytes]] = {s: [] for s in shards}
        for shard, member in self.deliveries.in_flight:
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
        self.targets.learn(self.store.inventory.waits(sorted(shards)))

    def run(self, stop: threading.Event) -> None:
        """Move records until ``stop`` is set, then drain what is in flight."""
        failures = 0
        while not stop.is_set():
            self.turns.begin()
            try:
                self.step()
                if failures:
                    failures = 0
                    self.readiness.ok("mover")
                    logger.info("mover reaches redis again")
                if self.inflight >= self.max_inflight:
                    # At capacity: poll returns as soon as the first delivery report is in.
                    self.producer.poll(self.turns.waits(INFLIGHT_POLL_S))
                    continue
                self._wait(self._seconds_to_next())
            except Exception as exc:  # Redis away, or a bug: claimed records' leases run out
                failures += 1
                wait = backoff(ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S, failures)
                if isinstance(exc, StoreError):
                    self.metrics.redis_errors.labels(stage="egress").inc()
                self.readiness.fail("mover", f"mover cannot claim or acknowledge records: {exc}",
                                    write_refused=isinstance(exc, WriteRefused))  # fmt: skip
                log_failed_turn(logger, exc, "mover backing off %.1fs: %s", wait, exc)
                stop.wait(self.turns.waits(wait))

    def _seconds_to_next(self) -> float:
        """Until the first owned shard is to be claimed from or the delivery reports applied
        (at most IDLE_WAIT_S)."""
        if self._stored or self._taking_over:
            return 0.0
        seconds = IDLE_WAIT_S
        ack_by = self.deliveries.ack_by
        if ack_by is not None:
            seconds = min(seconds, max(0.0, ack_by - time.monotonic()))
        first = self.plan.first(self.owned)
        if first != NEVER:
            until = max(0.0, (first - self.clock.now_ms()) / 1000)
            if self._starved and self.rate is not None:  # records are due: the rate says when
                until = max(until, self.rate.wait_s())
            seconds = min(seconds, until)
        waiting = self.targets.wait_s(self.clock.now_ms())
        return seconds if waiting is None else min(seconds, waiting)

    def _wait(self, seconds: float) -> None:
        if self.deliveries.in_flight and not self.tick_ms:
            # Delivery reports arrive through poll, which returns at the first; keep the slice
            # short so an earlier record stored meanwhile by ingress is not held up long.
            self.producer.poll(self.turns.waits(min(seconds, INFLIGHT_POLL_S)))
            return
        if self.deliveries.in_flight:
            # Reports are applied once per tick anyway: collect them at the next step (poll(0))
            # instead of waking for each one. While the sender has records to produce it polls
            # too: the mover then applies them at most half an ``ahead`` window later.
            seconds = min(seconds, (self._ack_wait_ms if len(self.sender) else self.tick_ms) / 1000)
        self.turns.waits(seconds)
        if seconds > 0:
            self._wake.wait(seconds)
            self._wake.clear()

    def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for in-flight deliveries; release the unacknowledged rest."""
        deadline = time.monotonic() + timeout_s
        self.sender.release()
        self.deliveries.drain(deadline)
