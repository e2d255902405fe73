"""When the mover claims from each shard next: due times, leases, the tick, what ingress stored."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from bridge.health import Readiness
from bridge.message import format_duration_ms, wall_ms
from bridge.metrics import Metrics
from bridge.store import Claims, Shard

IDLE_WAIT_S = 5.0  # a safety net only: wake-ups come from due times and ingress
NEVER = float("inf")
HOLD_WAIT_S = 0.05  # the longest sleep while due records wait for a catching-up ingress


CLAIMS_TIMED = 8  # the lead covers the slowest of this many last claims


def ahead_limit(batch_size: int) -> int:
    """The most records a claim takes ahead from a shard: half a batch. Where a window holds
    more (a high rate) the claim stops there and the shard is claimed again a lead before the
    first record it left, so a claim's size and its run in Redis stop growing with the rate;
    below it (a moderate rate) a whole window comes in one call (docs/bench/history.md,
    "A wider window, half a batch at most")."""
    return batch_size // 2


def least_lead_ms(ahead_ms: int) -> int:
    """How long before its next record falls due a shard is claimed from, at least, with claims
    ahead (``egress.ahead``): a quarter window, 25 ms at the defaults, so a claim takes three
    quarters of a window's records while they keep coming — a tenth less CPU per record than
    claims every half window took (docs/bench/history.md, "Claims a quarter window before
    due"). :attr:`Plan.lead_ms` stretches it to the slowest of the last claims."""
    return ahead_ms // 4


ACK_WAIT_MAX_MS = 75  # acknowledgements wait at most this long while nothing is held ahead


def ack_waits(tick_ms: int, ahead_ms: int) -> tuple[int, int]:
    """How long delivered records wait for their shard's next claim to carry their
    acknowledgements before they go on their own: while nothing is held ahead, and while records
    are. Held records mean the next claim comes within a window less the lead: that long.
    Otherwise none may come soon (the end of a drain, records with their own delay-ids): at most
    ACK_WAIT_MAX_MS, so the backlog gauges and what a crash leaves leased do not go by the
    window (docs/bench/history.md, "A wider window, half a batch at most")."""
    wait = ahead_ms - least_lead_ms(ahead_ms)
    return max(tick_ms, min(wait, ACK_WAIT_MAX_MS)), max(tick_ms, wait)


@dataclass(frozen=True, slots=True)
class Moment:
    """When a step of the mover decides: ``ms``, the decision clock's reading (NEVER before the
    first claim), and ``fixed``, the time a test gives its claims instead (None: Redis TIME
    decides, capped by the decision clock)."""

    ms: float
    fixed: int | None = None

    @property
    def cap_ms(self) -> int | None:
        """The ceiling a claim made at this moment puts on Redis TIME (None: none)."""
        return None if self.fixed is not None or math.isinf(self.ms) else int(self.ms)


class DecisionClock:
    """The time a record's fate is decided by (DESIGN "Never early, whatever one clock says"):
    the lesser of Redis's clock — as of the last claim, carried on by the monotonic clock, so
    slightly behind Redis's by the reply's trip — and this host's wall clock.

    Either clock stepping forward (an NTP step; a failover to a Redis whose host is off) makes
    nothing early, ends no lease and expires nothing on time: the other one decides. A step back
    makes records late by the step, never early; :meth:`skew_ms` shows it (a metric, /readyz).
    Claims take :meth:`decision_ms` as the ceiling on Redis TIME (claim.lua)."""

    def __init__(self, wall: Callable[[], int] = wall_ms) -> None:
        self._wall = wall
        self._redis_minus_local_ms: float | None = None

    @property
    def known(self) -> bool:
        """Whether a claim has told Redis's time yet."""
        return self._redis_minus_local_ms is not None

    def set(self, claims: Claims) -> None:
        """Take the time a claim's reply told (Redis TIME at its end, never capped)."""
        self._redis_minus_local_ms = claims.clock_ms - claims.received * 1000

    def _redis_ms(self) -> float | None:
        if self._redis_minus_local_ms is None:
            return None
        return time.monotonic() * 1000 + self._redis_minus_local_ms

    def now_ms(self) -> float:
        """The decision time now (NEVER before the first claim: every shard is due for one)."""
        redis_ms = self._redis_ms()
        return NEVER if redis_ms is None else min(redis_ms, self._wall())

    def moment(self, fixed_ms: int | None = None) -> Moment:
        """The moment a step decides by: now, or the ``fixed_ms`` a test gives."""
        return Moment(self.now_ms() if fixed_ms is None else fixed_ms, fixed_ms)

    def decision_ms(self) -> int:
        """The decision time now as epoch ms, the wall clock before the first claim: what
        expiry and lateness go by, and the ceiling a claim puts on Redis TIME."""
        wall = self._wall()  # read per record produced and per delivery report: kept lean
        offset = self._redis_minus_local_ms
        if offset is None:
            return wall
        redis_ms = int(time.monotonic() * 1000 + offset)
        return redis_ms if redis_ms < wall else wall

    def stamp_limit(self) -> int:
        """The latest record stamp the ingress takes as how far a partition is read: the
        decision time, and none (-1) before a claim told Redis's time — this host's clock alone
        may be the one that is ahead (bridge.ingress.batch)."""
        return -1 if self._redis_minus_local_ms is None else self.decision_ms()

    def ceiling(self, given_ms: int | None) -> int | None:
        """The ceiling a claim puts on Redis TIME: the decision time, or None when the caller
        gives the claim's now (a test's: exact)."""
        return None if given_ms is not None else self.decision_ms()

    def skew_ms(self) -> float | None:
        """Redis's clock minus this host's, ms (None before the first claim)."""
        redis_ms = self._redis_ms()
        return None if redis_ms is None else redis_ms - self._wall()


def tell_clock(
    clock: DecisionClock, claims: Claims, metrics: Metrics, readiness: Readiness, max_skew_ms: int
) -> None:
    """Tell ``clock`` the time a claim's reply told. The skew of Redis's clock from this host's
    is a metric and, past ``max_skew_ms`` (``egress.max_clock_skew``), a fault /readyz names;
    nothing is early meanwhile: the earlier clock decides."""
    clock.set(claims)
    skew_ms = clock.skew_ms()
    if skew_ms is None:
        return
    metrics.clock_skew.set(skew_ms / 1000)
    if abs(skew_ms) > max_skew_ms:
        ahead = "ahead of" if skew_ms > 0 else "behind"
        readiness.fail(
            "clock",
            f"clock skew: Redis's clock is {format_duration_ms(int(abs(skew_ms)))} {ahead} this "
            f"host's (egress.max_clock_skew {format_duration_ms(max_skew_ms)}); deliveries go "
            "by the earlier one, so records may be late, never early",
        )
    elif readiness.detail("clock"):
        readiness.ok("clock")


class Plan:
    """When each owned shard is claimed from next, on Redis's clock (from its last claim's
    reply), and the earliest moment the tick allows; a shard absent is unknown: claimed at once."""

    def __init__(self, tick_ms: int, ahead_ms: int, limit: int | None = None) -> None:
        self.tick_ms = tick_ms
        self.ahead_ms = ahead_ms
        self.limit = limit  # the most records a claim takes ahead from a shard (None: no limit)
        self._least_lead_ms = least_lead_ms(ahead_ms)
        self._took_ms: deque[float] = deque(maxlen=CLAIMS_TIMED)
        self._next_ms: dict[Shard, float] = {}
        self._not_before_ms: dict[Shard, float] = {}

    def took(self, ms: float) -> None:
        """A claim took ``ms``, from the call to its records in memory."""
        self._took_ms.append(ms)

    @property
    def lead_ms(self) -> float:
        """How long before its next record falls due a shard is claimed from: :func:`least_lead_ms`,
        or the slowest of the last claims (a busy machine, a large claim at a high rate) so the
        records are in memory by their due time — at most half a window, where claims come at
        the latest anyway."""
        slowest = max(self._took_ms, default=0.0)
        return min(self.ahead_ms / 2, max(self._least_lead_ms, slowest))

    def forget(self, shards: Iterable[Shard]) -> None:
        """Nothing is known of these shards: claim from them at once (if owned)."""
        for shard in shards:
            self._next_ms.pop(shard, None)
            self._not_before_ms.pop(shard, None)

    def claim_at(self, shard: Shard) -> float:
        """When ``shard`` is claimed from next (0: at once)."""
        return max(self._next_ms.get(shard, 0.0), self._not_before_ms.get(shard, 0.0))

    def first(self, owned: Iterable[Shard]) -> float:
        """When the first of ``owned`` is claimed from (NEVER: none)."""
        return min((self.claim_at(s) for s in owned), default=NEVER)

    def to_claim(self, owned: Iterable[Shard], now: float) -> list[Shard]:
        """The shards to claim from at ``now``: none unless one's claim is due; then every shard
        not held back (by a tick or a catch-up) whose next claim is at most half an ``ahead``
        window away — one Redis call for them all, rather than one per shard as their plans drift
        apart (without claims ahead, exactly the due ones). A shard claimed a little before its
        plan takes records due within the same window of now, none before their due time."""
        shards = sorted(owned)
        if not any(self.claim_at(s) <= now for s in shards):
            return []
        soon = now + self.ahead_ms / 2
        return [
            s
            for s in shards
            if self._not_before_ms.get(s, 0.0) <= now and self._next_ms.get(s, 0.0) <= soon
        ]

    def stored(self, earliest: Mapping[Shard, int], horizons: Mapping[Shard, int]) -> None:
        """Records ingress stored meanwhile may fall due before a shard's planned claim."""
        for shard, due_ms in earliest.items():
            if shard in self._next_ms:
                self._next_ms[shard] = min(self._next_ms[shard], due_ms - self.lead_ms)
            if shard in horizons:  # its horizon moved with the batch: what it releases goes now
                self._not_before_ms.pop(shard, None)

    def claimed(self, claims: Claims, per_shard: int, horizons: Mapping[Shard, int]) -> list[Shard]:
        """When to claim from each shard again: at once while a claim comes back full (a
        backlog), else at its next due time or lease deadline — but, while records keep falling
        due, no sooner than a tick after this claim, so one call takes a tick's worth of them.
        Returns the retired incarnations that came back with nothing left in them."""
        got = Counter(item.shard for item in claims)
        empty: list[Shard] = []
        lead = self.lead_ms
        for shard, next_ms in claims.next_ms.items():
            if got[shard] >= per_shard:
                self._next_ms[shard], self._not_before_ms[shard] = claims.now_ms, 0.0
                continue
            # Nothing left: look again after IDLE_WAIT_S anyway (a safety net; ingress wakes
            # the mover for what it stores).
            idle = claims.now_ms + IDLE_WAIT_S * 1000
            plan = idle if next_ms is None else next_ms
            if self.ahead_ms:
                # Records are claimed ahead: look again a lead before the next one falls due,
                # but not within half a window of this claim (a record with its own delay-id
                # is claimed at its due time, as without).
                if self.limit is not None and got[shard] >= self.limit:
                    plan -= lead  # the limit cut the window short: what is left is due in it
                else:
                    plan = min(plan, max(plan - lead, claims.now_ms + self.ahead_ms / 2))
            self._next_ms[shard] = plan
            self._not_before_ms[shard] = claims.now_ms + self.tick_ms if got[shard] else 0.0
            if shard in horizons:
                # Due records may wait for the ingress's horizon: the ingress wakes the mover
                # with every batch it stores, and this keeps a due one from turning the loop hot.
                self._not_before_ms[shard] = claims.now_ms + HOLD_WAIT_S * 1000
            if next_ms is None and shard.incarnation and not got[shard]:
                empty.append(shard)
        return empty

    def claim_again(self, shards: Iterable[Shard], at_ms: float) -> None:
        """Records of these shards are claimable again at ``at_ms``: claim then, not when their
        leases would have run out."""
        for shard in shards:
            self._next_ms[shard] = min(self._next_ms.get(shard, NEVER), at_ms)

    def hold_back(self, shards: Iterable[Shard], until_ms: float) -> None:
        """Claim from these shards no sooner than ``until_ms`` — and then: what they hold back
        is due (records put back, or a lower lane's), which the claim that took them may not
        have counted in their next claim's time."""
        for shard in shards:
            self._not_before_ms[shard] = until_ms
            self._next_ms[shard] = min(self._next_ms.get(shard, NEVER), until_ms)
