"""The mover against a catch-up that begins while its claim is in flight, on the real Redis and
Kafka: the ingress may start re-reading a partition (a Redis rebuilt from the committed offsets,
a new assignment) after the mover read the horizons and before Redis runs its claim."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from bridge.catchup import CatchUp
from bridge.config import EgressConfig
from bridge.egress import Egress
from bridge.message import Cancel, Scheduled
from bridge.metrics import Metrics
from bridge.store import Claims, Shard, Store
from tests.conftest import Services

pytestmark = pytest.mark.integration

SHARD = Shard("delay", 0)


class ClaimRacingACatchUp(Store):
    """The ingress begins catching up on SHARD while the mover's claim is on its way (after the
    mover read the horizons, before it has the reply)."""

    def __init__(self, client: redis.Redis, prefix: str, catch_up: CatchUp) -> None:
        super().__init__(client, prefix)
        self.catch_up = catch_up

    def claim(self, *args: Any, **kwargs: Any) -> Claims:
        claims = super().claim(*args, **kwargs)
        self.catch_up.start(SHARD, 0, 10)  # seeks back and re-reads: nothing read yet
        return claims


def test_a_record_claimed_as_a_catch_up_begins_waits_for_it(
    services: Services, redis_client: redis.Redis, unique: str
) -> None:
    # A record due now with its own delay-id; its cancel may sit in the part of the log the
    # ingress is about to re-read. Claimed before the catch-up began, it must not be produced.
    catch_up = CatchUp()
    store = ClaimRacingACatchUp(redis_client, f"test-{unique}", catch_up)
    now = store.time_ms()
    record = Scheduled(0, now - 1, "out", b"k", b"v", [], "job-1")
    store.add({SHARD: (0, [record])})
    producer = Producer({"bootstrap.servers": services.bootstrap})
    config = EgressConfig(batch_size=10, tick=0, send_tick=0, ahead=0)
    egress = Egress(
        producer, store, Metrics(CollectorRegistry()), config, dead_letter="dlq", catch_up=catch_up
    )
    egress.add_shards({SHARD})
    egress.step()
    assert catch_up.horizons() == {SHARD: 0}
    assert not egress.deliveries.in_flight, (
        "a record claimed as its partition's catch-up began was produced"
    )
    backlog = store.backlog([SHARD])
    assert (backlog.overdue, backlog.inflight) == (1, 0)  # waiting again, not in flight
    # ... where the cancel the ingress is about to re-read finds it.
    assert store.add({SHARD: (1, [Cancel(1, "job-1")])}).cancelled == 1
    assert store.backlog([SHARD]).overdue == 0
    assert producer.flush(5) == 0
