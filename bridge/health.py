"""Readiness: the faults that keep the bridge from doing its job right now, by check name.

Stages report what they meet (a DLQ produce that failed, a Redis that refuses writes) and a probe
loop looks for the rest on a timer, so /readyz, ``delay_bridge_ready`` and the log say the same
thing while a fault lasts. A check is one line of /readyz, set with :meth:`Readiness.fail` and
cleared with :meth:`Readiness.ok`; a stage that only learns it passes again by trying (the
journal's writes) gives the probe loop a way to try (:meth:`Readiness.try_with`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from prometheus_client import Gauge

from bridge.errors import StoreError
from bridge.store import Shard, Store

logger = logging.getLogger(__name__)

PROBE_INTERVAL_S = 2.0  # Redis writable
TOPIC_PROBE_INTERVAL_S = 10.0  # the DLQ topic exists
# An owned delay partition whose leader the consumer knows but fetches from no broker for this
# long (two statistics documents, 5 s apart) is stuck inside librdkafka: a leader move takes it
# from one broker to the next within a metadata round.
UNFETCHED_S = 5.0


class Readiness:
    """Named faults; thread-safe. An empty :meth:`problems` means ready."""

    def __init__(self) -> None:
        self._faults: dict[str, str] = {}
        self._refused: set[str] = set()  # the checks failing because Redis refused a write
        self._tries: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def try_with(self, again: Callable[[], None]) -> None:
        """Have the probe loop call ``again`` on each round (:meth:`try_again`): it tries what
        a failing check of its caller's is about, and says so with :meth:`ok` or :meth:`fail`."""
        with self._lock:
            self._tries.append(again)

    def try_again(self) -> None:
        """Call what :meth:`try_with` was given (the probe loop, every round)."""
        with self._lock:
            tries = list(self._tries)
        for again in tries:
            again()

    def fail(self, check: str, detail: str, *, write_refused: bool = False) -> None:
        """Record that ``check`` fails, with a one-line ``detail`` naming what is at fault, and
        whether it failed because Redis refused one of its writes (out of memory, read-only)."""
        with self._lock:
            self._faults[check] = detail
            if write_refused:
                self._refused.add(check)
            else:
                self._refused.discard(check)

    def ok(self, check: str) -> None:
        """``check`` passes again."""
        with self._lock:
            self._faults.pop(check, None)
            self._refused.discard(check)

    def writes_refused(self) -> bool:
        """Whether a stage's last write to Redis was refused (and none of its writes has gone
        through since): Redis may still take the probe's tiny write — a batch of records carries
        its own size into Redis's memory — yet not the bridge's."""
        with self._lock:
            return bool(self._refused)

    def detail(self, check: str) -> str:
        """What ``check`` last failed with ("" while it passes)."""
        with self._lock:
            return self._faults.get(check, "")

    def problems(self) -> list[str]:
        """The failing checks' details, in a stable order."""
        with self._lock:
            return [self._faults[k] for k in sorted(self._faults)]


class Probes:
    """Checks what no stage would notice by itself: that Redis takes writes (a master, not a
    replica left behind by a failover; not out of memory; the ACL lets it) and that the DLQ topic
    and the journal exist. It runs on a thread of its own, so these checks never hold up a stage."""

    def __init__(
        self,
        store: Store,
        readiness: Readiness,
        dead_letter: str,
        missing_topics: Callable[[list[str]], dict[str, str]],
        *,
        writable: Gauge | None = None,
        also_describe: Sequence[str] = (),
        journal: str = "",
    ) -> None:
        self.store = store
        self.each_round: list[Callable[[], None]] = []  # more checks, on this thread, every round
        # Described with the DLQ so their topic ids stay fresh for the ingress's incarnation check.
        self.also_describe = list(also_describe)
        self.writable = writable
        self.readiness = readiness
        self.dead_letter = dead_letter
        self.journal = journal
        self._missing_topics = missing_topics
        self._next_topic_probe = 0.0

    def redis_once(self) -> bool:
        """Write to Redis once; returns whether it worked (the fault is in /readyz if not).
        Redis counts as writable only if the stages' own writes go through too."""
        try:
            self.store.probe()
        except StoreError as exc:
            self.readiness.fail("redis", str(exc))
            if self.writable is not None:
                self.writable.set(0)
            return False
        self.readiness.ok("redis")
        if self.writable is not None:
            self.writable.set(0 if self.readiness.writes_refused() else 1)
        return True

    def topics_once(self) -> None:
        """Check that the DLQ topic and the journal exist."""
        journal = [self.journal] if self.journal else []
        missing = self._missing_topics([self.dead_letter, *journal, *self.also_describe])
        if self.journal in missing:
            detail = f"journal topic {self.journal} is not usable: {missing[self.journal]}"
            if self.readiness.problems().count(detail) == 0:
                logger.error("%s; records are delivered without their fates journaled", detail)
            self.readiness.fail("journal-topic", detail)
        else:
            self.readiness.ok("journal-topic")
        if self.dead_letter in missing:
            detail = f"DLQ topic {self.dead_letter} is not usable: {missing[self.dead_letter]}"
            if self.readiness.problems().count(detail) == 0:
                logger.error(
                    "%s; records that fail validation cannot be dead-lettered, so "
                    "their partitions stop until it is created",
                    detail,
                )
            self.readiness.fail("dlq-topic", detail)
        else:
            self.readiness.ok("dlq-topic")

    def run(self, stop: threading.Event) -> None:
        """Probe until ``stop`` is set."""
        while not stop.is_set():
            self.redis_once()
            if time.monotonic() >= self._next_topic_probe:
                self._next_topic_probe = time.monotonic() + TOPIC_PROBE_INTERVAL_S
                self.topics_once()
            self.readiness.try_again()
            for check in self.each_round:
                check()
            stop.wait(PROBE_INTERVAL_S)


class FetchWatch:
    """The ``fetching`` check, from the consumer's statistics: an owned delay partition whose
    leader is known but that librdkafka fetches from no broker for UNFETCHED_S.

    librdkafka can leave a partition on its internal broker when one metadata update moves the
    partition to a new leader and also drops its old broker (a broker fenced after it stopped
    answering); it moves it again only when the leader epoch changes (confluentinc/librdkafka#4804,
    still in librdkafka 2.16). Records produced to it would then not be read until its leadership
    moves again, which may be much later than the broker's return; the ingress starts its consumer
    again instead (:meth:`bridge.ingress.Ingress.restart_soon`).
    """

    def __init__(
        self,
        readiness: Readiness,
        clock: Callable[[], float] = time.monotonic,
        unfetched_s: float = UNFETCHED_S,
    ) -> None:
        self.readiness = readiness
        self._clock = clock
        self.unfetched_s = unfetched_s
        self._since: dict[Shard, float] = {}  # unfetched since (monotonic)

    def update(self, stats: Mapping[str, Any], owned: Collection[Shard]) -> list[Shard]:
        """Take a statistics document; returns the partitions stuck for UNFETCHED_S or more."""
        now = self._clock()
        unfetched = []
        for topic, t in stats.get("topics", {}).items():
            for pid, p in t.get("partitions", {}).items():
                shard = Shard(topic, int(pid))
                if shard in owned and p.get("leader", -1) >= 0 and p.get("broker", -1) < 0:
                    unfetched.append((shard, p["leader"]))
        self._since = {s: self._since.get(s, now) for s, _ in unfetched}
        stuck = [
            (s, leader)
            for s, leader in sorted(unfetched)
            if now - self._since[s] >= self.unfetched_s
        ]
        if not stuck:
            self.readiness.ok("fetching")
            return []
        oldest = max(now - self._since[s] for s, _ in stuck)
        names = ", ".join(f"{s.topic}[{s.partition}] (leader {leader})" for s, leader in stuck)
        detail = (
            f"consumer fetches {names} from no broker for {oldest:.0f}s "
            "(librdkafka#4804): starting it again"
        )
        self.readiness.fail("fetching", detail)
        logger.error("%s", detail)
        return [s for s, _ in stuck]

    def reset(self) -> None:
        """Forget the waits seen so far (the consumer is started again)."""
        self._since.clear()
