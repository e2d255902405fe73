"""Prometheus metrics, all on one injected registry (names are part of the contract)."""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily

from bridge import __version__
from bridge.catchup import HELD_WHYS
from bridge.message import Priority, Reason
from bridge.store import Shard

logger = logging.getLogger(__name__)
READ_BACK_RESULTS = ("stored", "missing", "refused")
REBUILD_CAUSES = ("redis-lost-state", "redis-lost-writes", "topic-recreated", "offsets-went-back")
# Why Redis handed out again a record whose fate was sealed (delay_bridge_redeliveries_avoided).
AVOIDED_CAUSES = ("take-over", "lease-expired", "redis-lost-writes")

# 1 ms to 1 h: sub-second precision matters as much as catch-up after an outage.
LATENESS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
)

# The bridge's own share of the lateness: finer, since the sender hands records over within ms.
SEND_LATENESS_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    5.0,
    30.0,
)

# How far ahead of the due time a reference was read back: store.fetch_ahead (2 min) at least.
READ_BACK_BUCKETS = (0.0, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


class BatchHistogram(Histogram):
    """A :class:`Histogram` (or a labelled one's child) that also takes a batch of observations at
    once: one lock per bucket touched instead of two per observation, and a binary search instead
    of a scan. It reads the parent's bucket state (``_upper_bounds``, ``_buckets``, ``_sum``);
    tests/unit/test_metrics_batch.py checks it against :meth:`observe`."""

    def observe_many(self, amounts: Iterable[float]) -> None:
        """The same as :meth:`observe` for each of ``amounts`` (no exemplars)."""
        bounds = self._upper_bounds  # ends with +Inf, so every amount has a bucket
        counts = [0] * len(bounds)
        total = 0.0
        for amount in amounts:
            counts[bisect.bisect_left(bounds, amount)] += 1
            total += amount
        for bucket, count in zip(self._buckets, counts, strict=True):
            if count:
                bucket.inc(count)
        if total:
            self._sum.inc(total)


_CANCELS_KEPT = (
    "Cancels and replacements by delay-id that found nothing while another partition of their "
    "topic was being rebuilt in Redis, kept to look there again once it is whole"
)


class HeldPartitions:
    """``delay_bridge_held_partitions{reason}``, read at each scrape (CatchUp.held_partitions)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.read: Callable[[], Mapping[str, int]] = dict
        registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "delay_bridge_held_partitions",
            "Owned delay-topic partitions whose records wait for the ingress, by why",
            labels=["reason"],
        )
        counts = self.read()
        for why in HELD_WHYS:
            family.add_metric([why], counts.get(why, 0))
        yield family


class Metrics:
    """Every metric the bridge exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.held_partitions = HeldPartitions(registry)
        self.ingested = Counter(
            "delay_bridge_ingested", "Records stored in Redis", ["delay_topic"], registry=registry
        )
        self.delivered = Counter(
            "delay_bridge_delivered",
            "Records acknowledged by Kafka on their target topic",
            ["target_topic"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "delay_bridge_dead_lettered", "Records sent to the DLQ", ["reason"], registry=registry
        )
        self.expired = Counter(
            "delay_bridge_expired",
            "Records dead-lettered as expired: later than due + their max lateness",
            ["target_topic"],
            registry=registry,
        )
        self.cancelled = Counter(
            "delay_bridge_cancelled",
            "Cancel records applied: cancelled (a waiting record withdrawn) or not-found",
            ["result"],
            registry=registry,
        )
        self.replaced = Counter(
            "delay_bridge_replaced",
            "Waiting records replaced by a newer one with the same delay-id",
            registry=registry,
        )
        self.redelivered = Counter(
            "delay_bridge_redelivered",
            "Leases that expired and were handed out again",
            registry=registry,
        )
        self.redeliveries_avoided = Counter(
            "delay_bridge_redeliveries_avoided",
            "Records Redis held again after their fate was sealed (delivered, cancelled, "
            "dead-lettered: the journal or this replica's transactions say), forgotten instead "
            "of delivered again: left in flight by an earlier owner (take-over), claimed again "
            "after their lease (lease-expired), put back by a rollback (redis-lost-writes)",
            ["delay_topic", "cause"],
            registry=registry,
        )
        self.lateness = BatchHistogram(
            "delay_bridge_delivery_lateness_seconds",
            "Acknowledgement time minus due time, by the record's delay-priority",
            ["priority"],
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.send_lateness = BatchHistogram(
            "delay_bridge_send_lateness_seconds",
            "When the bridge handed a record to its producer minus the later of its due time and "
            "when the bridge stored it: the bridge's own share of delivery_lateness (the rest is "
            "the producer's batching and the brokers' acknowledgement)",
            buckets=SEND_LATENESS_BUCKETS,
            registry=registry,
        )
        self.scheduled = Gauge(
            "delay_bridge_scheduled_messages",
            "Records waiting in Redis for their due time (owned partitions)",
            registry=registry,
        )
        self.overdue = Gauge(
            "delay_bridge_overdue_messages",
            "Records already due and not yet delivered: waiting or in flight (owned partitions), "
            "by delay-priority",
            ["priority"],
            registry=registry,
        )
        self._held_gauges(registry)
        self.read_back = Counter(
            "delay_bridge_read_back",
            "References read back from the delay topic: stored (whole, for delivery), missing "
            "(the record was gone: DLQ as payload-missing at its due time) or refused (the rules "
            "refuse it now: DLQ at its due time)",
            ["result"],
            registry=registry,
        )
        self.read_back_ahead = BatchHistogram(
            "delay_bridge_read_back_seconds_ahead",
            "How long before its due time a reference was read back and stored whole (0: late)",
            buckets=READ_BACK_BUCKETS,
            registry=registry,
        )
        self.read_back_fetched = Counter(
            "delay_bridge_read_back_fetched",
            "Delay-topic records the read-back consumed, those it skipped over included (fetched "
            "/ read back: its read amplification)",
            registry=registry,
        )
        self.read_back_fetched_bytes = Counter(
            "delay_bridge_read_back_fetched_bytes",
            "Key, value and header bytes of the delay-topic records the read-back consumed",
            registry=registry,
        )
        self.inflight = Gauge(
            "delay_bridge_inflight_messages",
            "Records claimed and awaiting Kafka's acknowledgement (owned partitions)",
            registry=registry,
        )
        self.oldest_inflight = Gauge(
            "delay_bridge_oldest_inflight_seconds",
            "Age of the oldest record produced to Kafka and not yet acknowledged (0 when none)",
            registry=registry,
        )
        self.delivery_errors = Counter(
            "delay_bridge_delivery_errors",
            "Delivery reports that were failures, by librdkafka error name (the record is retried "
            "after a back-off, or dead-lettered after egress.max_attempts permanent ones)",
            ["error"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "delay_bridge_rate_limited",
            "Records claimed at egress.max_rate while more were due: each waited for the rate",
            ["target_topic"],
            registry=registry,
        )
        self.oldest_overdue = Gauge(
            "delay_bridge_oldest_overdue_seconds",
            "Age of the oldest due record not yet handed to Kafka (0 when none)",
            registry=registry,
        )
        self.clock_skew = Gauge(
            "delay_bridge_clock_skew_seconds",
            "Redis's clock minus this replica's (fates are decided by the earlier)",
            registry=registry,
        )
        self.ingest_lag = Gauge(
            "delay_bridge_ingest_lag_messages",
            "Delay-topic records not yet stored in Redis (log end from librdkafka statistics)",
            ["delay_topic", "partition"],
            registry=registry,
        )
        self.owned_partitions = Gauge(
            "delay_bridge_owned_partitions",
            "Delay-topic partitions this replica consumes and moves",
            registry=registry,
        )
        self.redis_writable = Gauge(
            "delay_bridge_redis_writable",
            "1 when Redis took the last probe write (a master with memory and permission to spare)",
            registry=registry,
        )
        self.dlq_errors = Counter(
            "delay_bridge_dlq_produce_errors",
            "Records the DLQ did not take (missing topic, no permission, broker down); they are "
            "retried with back-off and their partition waits",
            registry=registry,
        )
        self.journal_written = Counter(
            "delay_bridge_journal_written",
            "Journal entries Kafka took: each a record's fate (delivered, cancelled, replaced, "
            "dead-lettered, expired)",
            registry=registry,
        )
        self.journal_failures = Counter(
            "delay_bridge_journal_failures",
            "Journal entries Kafka refused (missing topic, no permission, broker down); delivery "
            "goes on without them",
            registry=registry,
        )
        self.cancels_kept = Gauge("delay_bridge_cancels_kept", _CANCELS_KEPT, registry=registry)
        self.journal_pending = Gauge(
            "delay_bridge_journal_pending",
            "Journal entries produced that Kafka has not yet taken or refused: how far the "
            "journal trails the deliveries",
            registry=registry,
        )
        self.transactions = Counter(
            "delay_bridge_transactions",
            "Exactly-once transactions (egress.exactly_once), by result: committed, aborted "
            "(their records produced again in the next), fenced (the shard's next owner took "
            "it over)",
            ["result"],
            registry=registry,
        )
        for result in ("committed", "aborted", "fenced"):
            self.transactions.labels(result=result)
        self.redis_errors = Counter(
            "delay_bridge_redis_errors",
            "Redis calls that failed (the stage retries with back-off)",
            ["stage"],
            registry=registry,
        )
        self.rebuilds = Counter(
            "delay_bridge_rebuilds",
            "Times the bridge re-read a delay-topic partition because Redis lost its state or "
            "writes, the topic was recreated, or its offsets went back",
            ["delay_topic", "cause"],
            registry=registry,
        )
        self.kafka_brokers_up = Gauge(
            "delay_bridge_kafka_brokers_up",
            "Brokers the consumer is connected to (librdkafka statistics)",
            registry=registry,
        )
        self.ready = Gauge(
            "delay_bridge_ready",
            "1 when Redis and Kafka are reachable and the consumer has joined its group",
            registry=registry,
        )
        self.build_info = Gauge(
            "delay_bridge_build_info", "Always 1; the version label", ["version"], registry=registry
        )
        self.build_info.labels(version=__version__).set(1)
        # The standard process_* (RSS, CPU, open fds) and python_* (version, GC) series.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        for reason in Reason:
            self.dead_lettered.labels(reason=reason.value)
        for stage in ("ingress", "egress", "read-back", "metrics"):
            self.redis_errors.labels(stage=stage)
        for result in ("cancelled", "not-found"):
            self.cancelled.labels(result=result)
        for result in READ_BACK_RESULTS:
            self.read_back.labels(result=result)
        for tier in ("full", "reference"):
            self.stored_bytes.labels(tier=tier)
        for priority in Priority:  # a series from the start: 0, not "no data", to alert on
            self.lateness.labels(priority=priority.label)

    def _held_gauges(self, registry: CollectorRegistry) -> None:
        """The gauges of what Redis holds for the owned partitions (bridge.sampler)."""
        self.references = Gauge(
            "delay_bridge_references_messages",
            "Far-future records Redis holds as references, to be read back from the delay topic "
            "store.fetch_ahead before they fall due (owned partitions)",
            registry=registry,
        )
        self.waiting = Gauge(
            "delay_bridge_waiting_messages",
            "Records Redis holds whole per target topic, waiting or in flight (owned partitions; "
            "not references): what limits.max_waiting_per_target counts. The 100 targets "
            'with the most; the rest summed as target_topic="(other)"',
            ["target_topic"],
            registry=registry,
        )
        recurring = "Recurring schedules of the owned partitions: running or paused"
        self.schedules = Gauge("delay_bridge_schedules", recurring, ["state"], registry=registry)
        self.waiting_quota = Gauge(
            "delay_bridge_waiting_quota_messages",
            "limits.max_waiting_per_target of each target delay_bridge_waiting_messages names",
            ["target_topic"],
            registry=registry,
        )
        self.stored_bytes = Gauge(
            "delay_bridge_stored_bytes",
            "Redis memory of the owned partitions' records (tier full: records held whole, waiting "
            "or in flight; tier reference: references), from MEMORY USAGE with 5 samples per key",
            ["tier"],
            registry=registry,
        )

    def declare_delay_topics(self, topics: Iterable[str]) -> None:
        """Create the per-delay-topic series at 0, so alerts see them from start-up."""
        for topic in topics:
            self.ingested.labels(delay_topic=topic)
            for cause in REBUILD_CAUSES:
                self.rebuilds.labels(delay_topic=topic, cause=cause)
            for cause in AVOIDED_CAUSES:
                self.redeliveries_avoided.labels(delay_topic=topic, cause=cause)

    def avoided(self, shard: Shard, cause: str, records: int) -> None:
        """``records`` of ``shard`` were not delivered again, for ``cause`` (AVOIDED_CAUSES)."""
        if records:
            self.redeliveries_avoided.labels(delay_topic=shard.topic, cause=cause).inc(records)

    def forget_partitions(self, shards: Iterable[Shard]) -> None:
        """Remove the lag series of revoked partitions."""
        for shard in shards:
            with contextlib.suppress(KeyError):  # never reported for this partition
                self.ingest_lag.remove(shard.topic, str(shard.partition))


def set_lag(
    metrics: Metrics, positions: Mapping[Shard, int | None], stats: Mapping[str, Any]
) -> int:
    """Update ``metrics``' lag gauges from a librdkafka statistics document; returns brokers up.

    ``positions`` is the next offset to store per owned shard (watermark + 1), or None when
    Redis has not told yet (then the committed offset, else the log start, stands in). The
    committed offset is the lowest *pending* one, so librdkafka's own consumer_lag would count
    every scheduled record; the lag here counts only records not yet read into Redis.
    """
    # Only real brokers: bootstrap and logical (GroupCoordinator) connections have no node id.
    up = len(
        {
            b.get("nodeid")
            for b in stats.get("brokers", {}).values()
            if b.get("state") == "UP" and b.get("nodeid", -1) >= 0
        }
    )
    metrics.kafka_brokers_up.set(up)
    for topic, t in stats.get("topics", {}).items():
        for pid, p in t.get("partitions", {}).items():
            shard = Shard(topic, int(pid))
            if shard not in positions:
                continue
            position = positions[shard]
            if position is None:
                committed = p.get("committed_offset", -1)
                position = committed if committed >= 0 else p.get("lo_offset", -1)
            end = p.get("ls_offset", -1)
            if end < 0:
                end = p.get("hi_offset", -1)
            if position >= 0 and end >= 0:
                metrics.ingest_lag.labels(delay_topic=topic, partition=pid).set(
                    max(0, end - position)
                )
    return up
