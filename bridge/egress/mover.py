"""The mover: claims due records from the owned shards and hands them to be produced.

It sleeps until the earliest due time or lease deadline of its shards (:mod:`.plan`), and ingress
wakes it early when it stores an earlier record. Records claimed ahead wait in memory for their
due time (:mod:`.sender`); delivery reports settle what was produced (:mod:`.settle`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Producer

from bridge.catchup import CatchUp
from bridge.config import EgressConfig
from bridge.egress.failures import Ident, backoff
from bridge.egress.lanes import Lanes, Stored
from bridge.egress.outlet import Transactions
from bridge.egress.plan import (
    HOLD_WAIT_S,
    IDLE_WAIT_S,
    NEVER,
    DecisionClock,
    Moment,
    Plan,
    ahead_limit,
    tell_clock,
)
from bridge.egress.rate import RateLimit, TargetLimits
from bridge.egress.sender import Sender
from bridge.egress.settle import Deliveries
from bridge.egress.takeover import TakeOver
from bridge.errors import StoreError, WriteRefused, log_failed_turn
from bridge.health import Readiness
from bridge.journal import Journal, Reconcile
from bridge.message import Priority
from bridge.metrics import Metrics
from bridge.store import Claimed, Claims, PerLane, Shard, Store
from bridge.turns import Turns

if TYPE_CHECKING:
    from bridge.tracing import Spans

logger = logging.getLogger(__name__)

INFLIGHT_POLL_S = 0.05
REBUILD_SETTLE_S = 5.0  # a rebuild's journal read waits this long for the commits in flight
# Redis failures: the mover waits this long, doubling per failure in a row up to the cap, which
# bounds how long it takes to resume once Redis answers again.
ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S = 0.25, 1.0


class Egress:
    """The mover and its sender: claims records, keeps those claimed ahead until due (a
    :class:`Sender`, on its own thread) and produces them through one :class:`Deliveries`, the
    owner of every record in flight. The mover runs on one thread and serves delivery reports."""

    deliveries_type = Deliveries  # a test may watch every record produced through a subclass

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
        clock: DecisionClock | None = None,
        journal: Journal | None = None,
        reconcile: Reconcile | None = None,
        transactions: Transactions | None = None,
        spans: Spans | None = None,
    ) -> None:
        self.catch_up = catch_up or CatchUp()
        self.readiness = readiness or Readiness()
        self.store = store
        self.metrics = metrics
        self.config = config
        self.clock = clock or DecisionClock()
        self.plan = Plan(config.tick, config.ahead, ahead_limit(config.batch_size))
        self.deliveries = self.deliveries_type(
            producer,
            store,
            metrics,
            self.readiness,
            config,
            dead_letter=dead_letter,
            clock_ms=self.clock.decision_ms,
            on_retry=self._claim_again,
            journal=journal,
            outlet=transactions,
            spans=spans,
        )
        committed = transactions.settings.committed if transactions is not None else None
        self.sender = Sender(config, self.clock, self.deliveries, committed)
        self.deliveries.holding = self.sender.__len__  # acks wait longer while records are held
        self.lanes = Lanes(self.deliveries.draining_lanes)
        self.rate = RateLimit(config.max_rate) if config.max_rate else None
        self.targets = TargetLimits(store, metrics, config.max_rate_per_target, config.lease)
        self._starved = False  # the last step claimed nothing for want of the rate's tokens
        self._stored = Stored()
        self.owned: frozenset[Shard] = frozenset()
        self._wake = threading.Event()
        # Shards assigned since the last step: their earlier owner's leases end first.
        self.taking_over = TakeOver(
            store,
            self.deliveries,
            reconcile,
            transactions,
            drop_held=self.sender.drop,
            wake=self._wake.set,
            readiness=self.readiness,
        )
        if transactions is not None:
            transactions.settings.on_ended = self.taking_over.ended
        self.last_loop, self.turns = time.monotonic(), Turns("mover")
        self.catch_up.wake = self._wake.set  # take-backs
        self.catch_up.stamp_limit = self.clock.stamp_limit  # how far a partition is read
        self.catch_up.take_out = self.sender.take_out

    def add_shards(self, shards: set[Shard]) -> None:
        """Move records of newly assigned partitions once their earlier owner's leases end."""
        self.taking_over.add(shards)
        self.owned = self.owned | shards
        self._wake.set()

    def remove_shards(self, shards: set[Shard]) -> None:
        """Stop claiming from revoked partitions and their retired incarnations."""
        gone = {s.base() for s in shards}
        self.taking_over.discard(gone)
        self.owned = frozenset(s for s in self.owned if s.base() not in gone)
        self.targets.forget(self.owned)

    def wait_settled(self, shards: set[Shard], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no record of these revoked partitions is in flight (the
        consumer's thread); returns how many still are (their next owner: TakeOver.give_up)."""
        left = self.deliveries.wait_settled(shards, timeout_s)
        self.taking_over.give_up(shards)
        return left

    def before_rebuild(self, shards: set[Shard]) -> None:
        """Exactly once: settle what is in flight of partitions about to be rebuilt (TakeOver)."""
        self.taking_over.before_rebuild(shards, REBUILD_SETTLE_S)

    def run_sender(self, stop: threading.Event) -> None:
        """The sender thread: produce records claimed ahead at their due time until ``stop``."""
        self.sender.run(stop)

    def last_loops(self) -> dict[str, float]:
        """When the mover's and the sender's loops last came round (monotonic s)."""
        return {"egress": self.last_loop, "sender": self.sender.last_loop}

    def readings(self, now_ms: int) -> tuple[int, Counter[Priority]]:
        """Records claimed ahead not due by ``now_ms``, and in flight and due, by priority."""
        return self.sender.not_due(now_ms), self.deliveries.due_in_flight(now_ms)

    def notify(self, earliest: Mapping[Shard, PerLane]) -> None:
        """Ingress stored records due from these times on (the earliest of each priority lane,
        -1: none); wake up in case one is sooner than planned."""
        self._stored.add(earliest)
        self._wake.set()

    def wake_up(self) -> None:
        """Cut the mover's and the sender's sleep short (stopping)."""
        self._wake.set()
        self.sender.wake.set()

    def step(self, now_ms: int | None = None) -> int:
        """Serve delivery reports, then claim and produce what is due. Returns the records claimed
        and kept (not put back, nor set aside for their target's rate). ``now_ms`` replaces the
        decision clock for the claim (tests); the loop passes None."""
        self.last_loop = time.monotonic()
        self.deliveries.poll(0)
        self.deliveries.apply_reports()
        self.deliveries.watch()
        self.turns.mark("applying delivery reports")
        self.sender.take_back(self.catch_up.asked_back())  # by cancels read in time
        if self.taking_over:
            self._take_over()
            self.turns.mark("taking shards over")
        if self._stored:
            self.plan.stored(self.lanes.stored(self._stored.take()), self.catch_up.horizons())
        now = self.clock.moment(now_ms)
        self.sender.send_due(now.ms)
        self.turns.mark("producing held records")
        room = self.deliveries.room()
        limited = False  # egress.max_rate leaves less room than the records in flight do
        if self.rate is not None:
            allowed = self.rate.allowance()
            limited, room = allowed < room, min(room, allowed)
        self.lanes.release(self.owned, self.plan)
        shards = self.plan.to_claim(self.taking_over.claimable(self.owned), now.ms)
        self._starved = bool(shards) and limited and room <= 0
        claimed = 0
        with self.catch_up.claiming():
            if shards and room > 0:
                claimed = self._claim(shards, room, now, limited)
            else:
                self.deliveries.ack()
            if self.targets.waiting and room > claimed:
                claimed += self._claim_waiting(now, room - claimed)
        self.deliveries.poll(0)
        self.turns.mark("producing claimed records")
        return claimed

    def _claim(self, shards: list[Shard], room: int, now: Moment, limited: bool) -> int:
        """Claim from ``shards``, produce what is due; returns the records kept (not put back)."""
        started = time.monotonic()
        per_shard = max(1, min(self.config.batch_size, room // len(shards)))
        horizons, acks = self.catch_up.horizons(), self.deliveries.acks_of(shards)
        claimed = self.store.claim(
            shards,
            per_shard,
            self.config.lease,
            now.fixed,
            horizons,
            ahead_ms=self.config.ahead,
            acks=acks,
            lanes=self.lanes.limits(shards),
            ahead_lanes=self.lanes.ahead(self.owned, now.ms + self.config.ahead),
            watermarks=self.catch_up.watermarks(),
            cap_ms=self.clock.ceiling(now.fixed),
            ahead_limit=self.plan.limit,
        )
        self.turns.mark("claiming from redis")
        self.deliveries.acknowledged(acks)
        self.deliveries.ack()
        tell_clock(self.clock, claimed, self.metrics, self.readiness, self.config.max_clock_skew)
        for shard in self.plan.claimed(claimed, per_shard, horizons):
            self._forget_if_drained(shard)
        backlog = self.lanes.claimed(claimed, self.plan)  # after the plan: it may hold some back
        put_back = self._put_back(
            claimed, self.lanes.too_low(claimed, self.deliveries.in_flight, backlog)
        )
        put_back |= self.targets.hold(claimed, self.deliveries.in_flight, put_back)
        if put_back:
            self.catch_up.put_back(claimed, put_back)
        if self.rate is not None:
            self.rate.count(claimed, self.metrics if limited else None, put_back)
        self.sender.dispatch(claimed, put_back, backlog)
        self.plan.took((time.monotonic() - started) * 1000)
        return len(claimed) - len(put_back)

    def _claim_waiting(self, now: Moment, room: int) -> int:
        """Claim from the wait indexes what the rate-limited targets' rates allow now."""
        got = self.targets.claim(now, room, self.catch_up, self.config.batch_size)
        for claims in got:
            if self.rate is not None:
                self.rate.take(len(claims))
            self.sender.dispatch(claims, set(), None)
        return sum(len(c) for c in got)

    def _put_back(self, claims: Claims, too_low: list[Claimed]) -> set[Ident]:
        """Records claimed that are not to be produced yet go back among the waiting ones, as if
        never claimed; returns them: ``too_low`` (:meth:`Lanes.too_low`), and those past a
        catch-up's horizon (:meth:`CatchUp.past`)."""
        past = self.catch_up.past(claims, self.deliveries.in_flight, claims.now_ms)
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
        shards = self.taking_over(self.owned)
        if not shards:
            return
        self.plan.forget(shards)  # nothing known of them yet: claim at once
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
                if self.deliveries.room() <= 0:
                    # At capacity: poll returns as soon as the first delivery report is in.
                    self.deliveries.poll(self.turns.waits(INFLIGHT_POLL_S))
                    continue
                self._wait(self._seconds_to_next())
            except Exception as exc:  # Redis away, or a bug: claimed records' leases run out
                failures += 1
                wait = backoff(ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S, failures)
                if isinstance(exc, StoreError):
                    self.metrics.redis_errors.labels(stage="egress").inc()
                self.taking_over.failed(exc)
                self.readiness.fail(
                    "mover",
                    f"mover cannot claim or acknowledge records: {exc}",
                    write_refused=isinstance(exc, WriteRefused),
                )
                log_failed_turn(logger, exc, "mover backing off %.1fs: %s", wait, exc)
                stop.wait(self.turns.waits(wait))

    def _seconds_to_next(self) -> float:
        """Until the next claim or acknowledgement is due (at most IDLE_WAIT_S)."""
        if self._stored or self.taking_over:
            return 0.0
        seconds = IDLE_WAIT_S
        ack_by = self.deliveries.ack_by
        if ack_by is not None:
            seconds = min(seconds, max(0.0, ack_by - time.monotonic()))
        first = self.plan.first(self.taking_over.claimable(self.owned))
        if first != NEVER:
            until = max(0.0, (first - self.clock.now_ms()) / 1000)
            if self._starved and self.rate is not None:  # records are due: the rate says when
                until = max(until, self.rate.wait_s())
            seconds = min(seconds, until)
        waiting = self.targets.wait_s(self.clock.now_ms())
        return seconds if waiting is None else min(seconds, waiting)

    def _wait(self, seconds: float) -> None:
        tick_ms = self.config.tick
        if self.deliveries.in_flight and not tick_ms:
            # Delivery reports arrive through poll, which returns at the first; keep the slice
            # short so an earlier record stored meanwhile by ingress is not held up long.
            self.deliveries.poll(self.turns.waits(min(seconds, INFLIGHT_POLL_S)))
            return
        if self.deliveries.in_flight:
            # Reports are applied once per tick anyway: collect them at the next step (poll(0))
            # instead of waking for each one. While the sender has records to produce it polls
            # too: the mover then applies them at most a window less the lead later.
            seconds = min(seconds, (self.deliveries.ack_waits[1] if self.sender else tick_ms) / 1e3)
        self.turns.waits(seconds)
        if seconds > 0:
            self._wake.wait(seconds)
            self._wake.clear()

    def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for in-flight deliveries; release the unacknowledged rest."""
        deadline = time.monotonic() + timeout_s
        self.sender.release()
        self.deliveries.drain(deadline)
