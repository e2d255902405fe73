"""The shards' transactional producers (exactly once) against a revoke, a rebuild's fence and
another replica's producer that land while one of them starts, on the real Kafka and Redis: a
partition the group assigns this replica is delivered, whichever order they come in."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaError, Producer
from prometheus_client import CollectorRegistry

from bridge.config import EgressConfig
from bridge.egress import Egress
from bridge.egress.outlet import Transactions
from bridge.egress.transactions import Settings
from bridge.health import Readiness
from bridge.journal import Journal
from bridge.message import Scheduled
from bridge.metrics import Metrics
from bridge.store import Shard, Store
from testbed.harness import Collector
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration

DELIVERY_S = 30.0  # a record due now reaches its topic well within this once its shard is owned


class Gated(Producer):
    """A transactional producer that calls ``after_init`` once its start has fenced the earlier
    owner, before the start returns: what lands in between (another thread's revoke, fence)."""

    after_init: Callable[[], None] = staticmethod(lambda: None)

    def init_transactions(self, *args: Any) -> None:
        super().init_transactions(*args)
        self.after_init()


class Bench:
    """An egress delivering exactly once from one shard of a real delay topic, stepped by the
    test on its own thread."""

    def __init__(
        self, services: Services, topics: TopicFactory, client: redis.Redis, unique: str
    ) -> None:
        self.bootstrap = services.bootstrap
        self.shard = Shard(topics("delay"), 0)
        self.target, journal = topics("out"), topics("journal")
        self.store = Store(client, f"test-{unique}")
        self.tid = f"test-{unique}:{self.shard.topic}:0"
        self.hooks: list[Callable[[], None]] = []  # called by the next producers started, once
        self.started = 0
        self._offset = 0  # of the next record stored
        self.registry = CollectorRegistry()
        metrics, readiness = Metrics(self.registry), Readiness()
        self.fatal: list[KafkaError] = []
        settings = Settings(
            self._producer,
            Journal(Producer({"bootstrap.servers": self.bootstrap}), journal, metrics, readiness),
            metrics,
            readiness,
            period_s=0.05,
            dead_letter="dlq",
            clock_ms=self.store.time_ms,
            on_fatal=self.fatal.append,
        )
        self.transactions = Transactions(settings)
        config = EgressConfig(batch_size=10, tick=0, send_tick=0, ahead=0)
        producer = Producer({"bootstrap.servers": self.bootstrap})
        self.egress = Egress(
            producer,
            self.store,
            metrics,
            config,
            dead_letter="dlq",
            readiness=readiness,
            transactions=self.transactions,
        )
        self.collector = Collector(self.bootstrap, [self.target], f"check-{unique}")

    def _producer(self, shard: Shard) -> Producer:
        producer = Gated(
            {"bootstrap.servers": self.bootstrap, "transactional.id": self.tid, "linger.ms": 1}
        )
        if self.hooks:
            producer.after_init = self.hooks.pop(0)
        self.started += 1
        return producer

    def fenced(self) -> float:
        """How many of this replica's producers were fenced (by one it did not start)."""
        value = self.registry.get_sample_value(
            "delay_bridge_transactions_total", {"result": "fenced"}
        )
        return value or 0.0

    def store_due(self, name: str) -> None:
        offset, self._offset = self._offset, self._offset + 1
        due = self.store.time_ms() - 1
        record = Scheduled(offset, due, self.target, b"k", name.encode(), [], "")
        self.store.add({self.shard: (offset, [record])})
        self.egress.notify({self.shard: (-1, due, -1)})  # as the ingress tells it

    def step_until_delivered(self, name: str, timeout: float = DELIVERY_S) -> None:
        def delivered() -> bool:
            self.egress.step()
            self.collector.poll(0.05)
            return any(r.value == name.encode() for r in self.collector.records)

        wait_for(delivered, timeout, f"{name} delivered")

    def close(self) -> None:
        self.transactions.stop()
        self.collector.close()


@pytest.fixture
def bench(services: Services, topics: TopicFactory, redis_client: redis.Redis, unique: str) -> Any:
    b = Bench(services, topics, redis_client, unique)
    yield b
    b.close()


def test_a_partition_revoked_and_assigned_again_while_its_producer_starts_is_delivered(
    bench: Bench,
) -> None:
    """Assigned, revoked while the take-over starts its producer, fenced for a rebuild and
    assigned again (a replica that leaves the group and joins it again, as bridge.ingress.unowned
    has it): the producer started for the first assignment closes with the revoke, the rebuild's
    fence fences nobody this replica delivers through, and the second assignment's producer
    delivers the partition's records."""
    shard = bench.shard

    def revoked_and_fenced() -> None:
        bench.egress.remove_shards({shard})
        bench.egress.wait_settled({shard}, 1.0)
        bench.transactions.fence({shard})  # the next assignment's rebuild (Egress.before_rebuild)

    bench.hooks.append(revoked_and_fenced)
    bench.egress.add_shards({shard})
    bench.egress.step()  # the take-over: its producer starts, the revoke lands meanwhile
    bench.egress.add_shards({shard})  # assigned again
    bench.store_due("after-rejoin")
    bench.step_until_delivered("after-rejoin")
    assert bench.fenced() == 0
    assert not bench.fatal


def test_a_partition_whose_producer_another_replica_fenced_is_taken_over_again_while_assigned(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    """Another producer with the partition's transactional id fences this replica's while the
    group still has the partition here (no revoke comes): the partition waits, then is taken
    over again with a new producer, and its records are delivered."""
    shard = bench.shard
    bench.egress.taking_over.fenced_retry_s = 1.0
    bench.egress.add_shards({shard})
    bench.store_due("before")
    bench.step_until_delivered("before")
    other = Producer({"bootstrap.servers": bench.bootstrap, "transactional.id": bench.tid})
    other.init_transactions(10)  # fences this replica's producer
    started = bench.started
    bench.store_due("after-fence")
    with caplog.at_level(logging.WARNING):
        bench.step_until_delivered("after-fence")
    assert bench.started == started + 1  # one new producer, after the fence
    assert bench.fenced() == 1
    assert "fenced" in caplog.text
    assert not bench.fatal


def test_a_partition_revoked_before_its_producer_reported_its_end_is_not_taken_over_again(
    bench: Bench,
) -> None:
    """A producer's fatal end (its state lost: an abort Kafka refused), reported from its thread
    just after the group revoked the partition, took the partition over again here: a new
    producer with its transactional id fenced the next owner's. A revoked partition stays
    another replica's until the group assigns it here again."""
    shard = bench.shard
    bench.egress.add_shards({shard})
    bench.store_due("before")
    bench.step_until_delivered("before")
    bench.egress.remove_shards({shard})
    bench.egress.wait_settled({shard}, 1.0)
    bench.egress.step()
    next_owner = Producer({"bootstrap.servers": bench.bootstrap, "transactional.id": bench.tid})
    next_owner.init_transactions(10)
    started = bench.started
    bench.egress.taking_over.ended(shard, False)  # late, from the ended producer's thread
    for _ in range(5):
        bench.egress.step()
    assert bench.started == started
    next_owner.begin_transaction()
    next_owner.produce(bench.target, b"the-next-owner")
    next_owner.commit_transaction(10)  # fenced, it would raise
    bench.egress.add_shards({shard})  # assigned here again: taken over
    bench.store_due("assigned-again")
    bench.step_until_delivered("assigned-again")
    assert bench.started == started + 1
