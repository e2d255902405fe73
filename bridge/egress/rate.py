"""Rate limits: token buckets bound the records the mover claims per second, in all and per target.

``egress.max_rate`` bounds a replica's claims (:class:`RateLimit`); ``egress.max_rate_per_target``
each listed target's (:class:`TargetLimits`), whose records beyond the rate wait in Redis.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping

from bridge.catchup import CatchUp
from bridge.egress.failures import Ident
from bridge.egress.plan import HOLD_WAIT_S, Moment
from bridge.message import Priority
from bridge.metrics import Metrics
from bridge.store import Claimed, Claims, Shard, Store

# The bucket holds at most this long's worth: a claim after a quiet spell takes no more than a
# tenth of a second of records at once, and a drain runs at the rate from its first second.
BURST_S = 0.1
# At the rate, a claim takes at least this long's worth: a few claims of many records rather than
# a claim per token.
STEP_S = 0.01


class RateLimit:
    """Records the mover may claim now; claims take what they got (a claim of one record per
    shard may overdraw it: the next waits the longer)."""

    def __init__(self, per_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self.clock = clock
        self.burst = max(1.0, per_s * BURST_S)
        self.step = max(1.0, per_s * STEP_S)
        self._tokens = self.burst
        self._at = clock()

    def allowance(self) -> int:
        """Records that may be claimed now (0 until the bucket holds a step's worth)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        tokens = self._tokens + 1e-9  # what float sums of elapsed time lose
        return int(tokens) if tokens >= self.step else 0

    def take(self, records: int) -> None:
        """``records`` were claimed."""
        self._tokens -= records

    def wait_s(self) -> float:
        """Until the bucket holds a step's worth again."""
        return max(0.0, (self.step - self._tokens) / self.per_s)

    def count(self, claims: Claims, metrics: Metrics | None, skip: Container[Ident] = ()) -> None:
        """Take a claim's records from the bucket, but those in ``skip`` (put back, or set aside
        for their target's rate: not produced). With ``metrics``, the limit cut the claim short:
        if records are still due after it, each of its records waited for the rate
        (``delay_bridge_rate_limited_total``, by target)."""
        kept = [c for c in claims if (c.shard, c.member) not in skip] if skip else claims
        self.take(len(kept))
        if metrics is not None and claims.due_lanes:
            for target, n in Counter(c.record.target for c in kept).items():
                metrics.rate_limited.labels(target_topic=target).inc(n)


class TargetLimits:
    """egress.max_rate_per_target: each listed target's records leave at most at its rate.

    A claim from a shard's due index takes records in due order whatever their target, so the
    records of a limited target beyond its rate cannot simply go back there: they would stand
    ahead of every other target's and be claimed again at once. They wait in their target's wait
    index instead (``Store.unclaim(wait=True)``), from which the mover claims them at the target's
    rate, priority first (``Store.claim_waiting``); while a target has records waiting, its records
    from the due index join them, so they leave in order. A target with records waiting but no
    rate (taken out of the configuration) has them claimed without a limit."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        rates: Mapping[str, int],
        lease_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.lease_ms = lease_ms
        self.buckets = {t: RateLimit(r, clock) for t, r in rates.items() if r > 0}
        # Targets with records in a wait index, by shard, with the earliest due time that index
        # holds as its last claim said (-1 at first: claim at once) and its lanes still due.
        self.waiting: dict[str, dict[Shard, int]] = {}
        self._due: dict[str, dict[Shard, frozenset[Priority]]] = {}

    def learn(self, waits: Mapping[Shard, Iterable[str]]) -> None:
        """Shards taken over hold records in these targets' wait indexes."""
        for shard, targets in waits.items():
            for target in targets:
                self.waiting.setdefault(target, {})[shard] = -1

    def forget(self, owned: Container[Shard]) -> None:
        """Shards no longer owned are no longer claimed from."""
        for target in list(self.waiting):
            kept = {s: t for s, t in self.waiting[target].items() if s in owned}
            if kept:
                self.waiting[target] = kept
            else:
                del self.waiting[target]
                self._due.pop(target, None)

    def hold(
        self, claims: Iterable[Claimed], in_flight: Container[Ident], skip: Container[Ident]
    ) -> set[Ident]:
        """Records of a claim from the due indexes beyond their target's rate — what its bucket
        holds now — or behind records of it already waiting go to wait in their target's wait
        index, counted in ``delay_bridge_rate_limited_total``; returns them. ``in_flight``
        records and those in ``skip`` (put back) stay."""
        over = self._over(claims, in_flight, skip)
        if not over:
            return set()
        self.store.unclaim(over, wait=True)
        for target, n in Counter(c.record.target for c in over).items():
            self.metrics.rate_limited.labels(target_topic=target).inc(n)
        return {(c.shard, c.member) for c in over}

    def _over(
        self, claims: Iterable[Claimed], in_flight: Container[Ident], skip: Container[Ident]
    ) -> list[Claimed]:
        if not self.buckets:
            return []
        taken: Counter[str] = Counter()
        out: list[Claimed] = []
        allowed: dict[str, int] = {}
        for c in claims:
            target = c.record.target
            bucket = self.buckets.get(target)
            ident = (c.shard, c.member)
            if bucket is None or ident in in_flight or ident in skip:
                continue
            if target not in allowed:
                allowed[target] = 0 if target in self.waiting else bucket.allowance()
            if taken[target] < allowed[target]:
                taken[target] += 1
            else:
                out.append(c)
        for target, n in taken.items():
            self.buckets[target].take(n)
        for c in out:
            self.waiting.setdefault(c.record.target, {})[c.shard] = -1
        return out

    def claim(self, now: Moment, room: int, catch_up: CatchUp, batch: int) -> list[Claims]:
        """Claim from the wait indexes what the targets' rates allow ``now`` (the mover's
        :class:`~bridge.egress.plan.Moment`; at most ``room`` in all): the claims of each target
        claimed from; ``catch_up`` gives the horizons and watermarks, as for the due indexes."""
        limits = self._limits(now.ms, room, batch)
        if not limits:
            return []
        got = self.store.claim_waiting(
            limits,
            self.lease_ms,
            now.fixed,
            catch_up.horizons(),
            self._lanes(),
            watermarks=catch_up.watermarks(),
            cap_ms=now.cap_ms,
        )
        self._claimed(got)
        return list(got.values())

    def _limits(self, now_ms: float, room: int, batch: int) -> dict[tuple[Shard, str], int]:
        """What to claim from each wait index now (``Store.claim_waiting``'s ``limits``): each
        waiting target's allowance shared among its shards with records due, at most ``room``
        in all, ``batch`` per shard for a target without a rate."""
        out: dict[tuple[Shard, str], int] = {}
        for target, shards in self.waiting.items():
            due = [s for s, first in shards.items() if first <= now_ms]
            bucket = self.buckets.get(target)
            allowed = min(room, batch * len(due) if bucket is None else bucket.allowance())
            if not due or allowed <= 0:
                continue
            for shard in due:
                out[shard, target] = max(1, allowed // len(due))
            room -= allowed
        return out

    def _lanes(self) -> dict[str, Priority]:
        """The lowest priority to claim of each target: the highest any of its shards still has
        due, so its records leave in priority order across shards."""
        return {
            t: min(p for lanes in due.values() for p in lanes)
            for t, due in self._due.items()
            if any(due.values())
        }

    def _claimed(self, claims: Mapping[str, Claims]) -> None:
        """Take what each target's claim from its wait indexes said: records taken from its
        bucket, the lanes still due, when each index next has a due record, and which are empty."""
        for target, got in claims.items():
            bucket = self.buckets.get(target)
            if bucket is not None:
                bucket.take(len(got))
            shards = self.waiting.get(target, {})
            due = self._due.setdefault(target, {})
            taken = Counter(c.shard for c in got)
            for shard in got.next_ms:
                due[shard] = got.due_lanes.get(shard, frozenset())
                firsts = [t for t in got.earliest.get(shard, ()) if t >= 0]
                if firsts:
                    # Due records the claim did not take (a catch-up's horizon, or a higher
                    # priority due in another shard) are tried again a moment later, not at once.
                    retry = 0 if taken[shard] else got.now_ms + int(HOLD_WAIT_S * 1000)
                    shards[shard] = max(min(firsts), retry)
                else:
                    shards.pop(shard, None)
                    due.pop(shard, None)
            if not shards:
                self.waiting.pop(target, None)
                self._due.pop(target, None)

    def wait_s(self, now_ms: float) -> float | None:
        """Until a wait index next has records to claim (None: none waits)."""
        waits = []
        for target, shards in self.waiting.items():
            bucket = self.buckets.get(target)
            first = max(0.0, (min(shards.values()) - now_ms) / 1000)
            waits.append(max(first, 0.0 if bucket is None else bucket.wait_s()))
        return min(waits, default=None)
