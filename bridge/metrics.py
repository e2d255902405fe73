"""Prometheus metrics, all on one injected registry (names are part of the contract)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bridge import __version__
from bridge.message import Reason

# 1 ms to 1 h: sub-second precision matters as much as catch-up after an outage.
LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
)  # fmt: skip


class Metrics:
    """Every metric the bridge exports, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
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
        self.redelivered = Counter(
            "delay_bridge_redelivered",
            "Leases that expired and were handed out again",
            registry=registry,
        )
        self.lateness = Histogram(
            "delay_bridge_delivery_lateness_seconds",
            "Acknowledgement time minus due time",
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.build_info = Gauge(
            "delay_bridge_build_info", "Always 1; the version label", ["version"], registry=registry
        )
        self.build_info.labels(version=__version__).set(1)
        for reason in Reason:
            self.dead_lettered.labels(reason=reason.value)

    def declare_delay_topics(self, topics: Iterable[str]) -> None:
        """Create the per-delay-topic series at 0, so alerts see them from start-up."""
        for topic in topics:
            self.ingested.labels(delay_topic=topic)
