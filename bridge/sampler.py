"""The gauges of what Redis holds, sampled on a short timer.

Backlog, per-target waiting records and their quotas, recurring schedules, stored bytes: each a
figure Redis keeps per shard, summed over the shards this replica owns."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from bridge.errors import StoreError
from bridge.message import Priority
from bridge.metrics import Metrics
from bridge.store import Shard, Store

logger = logging.getLogger(__name__)
SAMPLE_INTERVAL_S = 2.0
WAITING_TARGETS, OTHER_TARGETS = 100, "(other)"  # delay_bridge_waiting_messages's series at most


class Sampler:
    """Mirrors the Redis backlog of the owned shards into gauges, on a short timer — and of the
    shards lost with the group session (Kafka unreachable) until the group forms again, so the
    gauges keep saying what falls due in the very outage that keeps it from being delivered."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        owned: Callable[[], Iterable[Shard]],
        ready: Callable[[], list[str]] = lambda: [],
        *,
        in_memory: Callable[[int], tuple[int, Mapping[Priority, int]]] = lambda now_ms: (0, {}),
        lost: Callable[[], Iterable[Shard]] = frozenset,
        due_by_ms: int | None = None,
        quota_of: Callable[[str], int | None] = lambda target: None,
    ) -> None:
        self.store = store
        self.quota_of = quota_of  # limits.max_waiting_per_target's, for its gauge
        self._shown: list[dict[str, int]] = [{}, {}]  # the per-target series of the two gauges
        self.metrics = metrics
        self.owned = owned
        self.lost = lost
        self.due_by_ms = due_by_ms  # records in flight count in the oldest (Store.backlog)
        self.ready = ready
        # This process's records in flight: how many are not due yet (claimed ahead), and how
        # many are due, by priority (Egress.readings).
        self.in_memory = in_memory
        self._bytes_denied = False

    def sample_once(self, now_ms: int | None = None) -> None:
        """Read the backlog of the owned (and lost) shards and set the gauges."""
        owned = set(self.owned())
        shards = sorted(owned | set(self.lost()))
        try:
            backlog = self.store.backlog(shards, now_ms, self.due_by_ms)
            waiting = self.store.targets.waiting_by_target(sorted(owned))
            schedules, paused = self.store.registry.counts(sorted(owned))
        except StoreError as exc:
            self.metrics.ready.set(0)
            self.metrics.redis_errors.labels(stage="metrics").inc()
            logger.warning("backlog sample failed: %s", exc)
            return
        m = self.metrics
        m.owned_partitions.set(len(owned))
        m.scheduled.set(backlog.scheduled)
        not_due, known = self.in_memory(backlog.now_ms)
        in_flight = max(0, backlog.inflight - not_due)
        for priority in Priority:
            overdue = backlog.overdue_by.get(priority, 0) + known.get(priority, 0)
            if priority is Priority.NORMAL:
                # In flight in Redis but not in this process (left by an earlier life, taken over
                # at the next claim): their priority is in their record, which only a claim reads.
                overdue += max(0, in_flight - sum(known.values()))
            m.overdue.labels(priority=priority.label).set(overdue)
        m.inflight.set(backlog.inflight)
        m.schedules.labels(state="running").set(schedules - paused)
        m.schedules.labels(state="paused").set(paused)
        m.references.set(backlog.references)
        self._sample_waiting(waiting)
        self._sample_bytes(sorted(owned))
        oldest = backlog.oldest_due_ms
        m.oldest_overdue.set(0 if oldest is None else max(0, backlog.now_ms - oldest) / 1000)
        m.ready.set(0 if self.ready() else 1)

    def _sample_waiting(self, waiting: collections.Counter[str]) -> None:
        """delay_bridge_waiting_messages and its quotas: a series per target among the
        WAITING_TARGETS with most, the rest as one; a target with none left loses its series."""
        top = waiting.most_common()
        shown = dict(top[:WAITING_TARGETS]) | (
            {OTHER_TARGETS: sum(n for _, n in top[WAITING_TARGETS:])}
            if len(top) > WAITING_TARGETS
            else {}
        )
        quotas = {t: q for t in shown if (q := self.quota_of(t)) is not None}
        for i, (gauge, now) in enumerate(
            ((self.metrics.waiting, shown), (self.metrics.waiting_quota, quotas))
        ):
            for target in self._shown[i].keys() - now.keys():
                gauge.remove(target)
            for target, n in now.items():
                gauge.labels(target_topic=target).set(n)
            self._shown[i] = now

    def _sample_bytes(self, shards: list[Shard]) -> None:
        if self._bytes_denied:
            return
        try:
            tiers = self.store.inventory.stored_bytes(shards)
        except StoreError as exc:  # MEMORY is often denied on managed Redis: the gauges stay 0
            self._bytes_denied = True
            logger.info("not sampling delay_bridge_stored_bytes: %s", exc)
            return
        for tier, n in tiers.items():
            self.metrics.stored_bytes.labels(tier=tier).set(n)

    def run(self, stop: threading.Event) -> None:
        """Sample every couple of seconds until ``stop`` is set."""
        while not stop.is_set():
            self.sample_once()
            stop.wait(SAMPLE_INTERVAL_S)
