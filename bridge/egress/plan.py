"""When the mover claims from each shard next: due times, leases, the tick, what ingress stored."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping

from bridge.store import Claims, Shard

IDLE_WAIT_S = 5.0  # a safety net only: wake-ups come from due times and ingress
NEVER = float("inf")
HOLD_WAIT_S = 0.05  # the longest sleep while due records wait for a catching-up ingress


class RedisClock:
    """Redis's clock as of the last claim, carried on by the local monotonic clock (slightly
    behind Redis's by the reply's trip: the mover wakes late, never early)."""

    def __init__(self) -> None:
        self._redis_minus_local_ms: float | None = None

    @property
    def known(self) -> bool:
        """Whether a claim has told the time yet."""
        return self._redis_minus_local_ms is not None

    def set(self, claims: Claims) -> None:
        """Take the time a claim's reply told."""
        self._redis_minus_local_ms = claims.clock_ms - claims.received * 1000

    def now_ms(self) -> float:
        """Redis's clock now (NEVER before the first claim: every shard is due for one)."""
        if self._redis_minus_local_ms is None:
            return NEVER
        return time.monotonic() * 1000 + self._redis_minus_local_ms


class Plan:
    """When each owned shard is claimed from next, on Redis's clock (from its last claim's
    reply), and the earliest moment the tick allows; a shard absent is unknown: claimed at once."""

    def __init__(self, tick_ms: int, ahead_ms: int) -> None:
        self.tick_ms = tick_ms
        self.ahead_ms = ahead_ms
        self._next_ms: dict[Shard, float] = {}
        self._not_before_ms: dict[Shard, float] = {}

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
                self._next_ms[shard] = min(self._next_ms[shard], due_ms - self.ahead_ms)
            if shard in horizons:  # its horizon moved with the batch: what it releases goes now
                self._not_before_ms.pop(shard, None)

    def claimed(self, claims: Claims, per_shard: int, horizons: Mapping[Shard, int]) -> list[Shard]:
        """When to claim from each shard again: at once while a claim comes back full (a
        backlog), else at its next due time or lease deadline — but, while records keep falling
        due, no sooner than a tick after this claim, so one call takes a tick's worth of them.
        Returns the retired incarnations that came back with nothing left in them."""
        got = Counter(item.shard for item in claims)
        empty: list[Shard] = []
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
                empty.append(shard)
        return empty

    def claim_again(self, shards: Iterable[Shard], at_ms: float) -> None:
        """Records of these shards are claimable again at ``at_ms``: claim then, not when their
        leases would have run out."""
        for shard in shards:
            self._next_ms[shard] = min(self._next_ms.get(shard, NEVER), at_ms)

    def hold_back(self, shards: Iterable[Shard], until_ms: float) -> None:
        """Claim from these shards no sooner than ``until_ms``."""
        for shard in shards:
            self._not_before_ms[shard] = until_ms
