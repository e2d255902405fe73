"""The ingress starting its delay-topic consumer again while records flow: what it does for a
partition librdkafka left fetched from no broker (bridge.health.FetchWatch), whose trigger only a
broker fault sets off (`make chaos CHAOS_ARGS=broker-freeze`)."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import Consumer, KafkaException
from prometheus_client import CollectorRegistry

from bridge.config import from_mapping
from bridge.ingress.restarts import is_fatal
from bridge.message import H_AFTER, H_TARGET_TOPIC
from bridge.service import Service
from bridge.store import Shard
from testbed.harness import Collector, bridge_env, produce_all
from tests.conftest import Services, TopicFactory, wait_for

pytestmark = pytest.mark.integration


def _service(
    services: Services, topics: TopicFactory, unique: str, **overrides: str
) -> tuple[Service, str, str]:
    """A bridge run in this process (group g-<unique>) on a delay topic of three partitions:
    (service, delay topic, target topic)."""
    delay, target = topics("delay", 3), topics("out")
    env = bridge_env(
        services.bootstrap,
        services.redis_url,
        topics__delay=delay,
        topics__dead_letter=topics("dlq"),
        topics__journal=topics("journal"),
        kafka__group_id=f"g-{unique}",
        redis__key_prefix=f"test-{unique}",
        **overrides,
    )
    return Service(from_mapping({}, env=env), CollectorRegistry()), delay, target


def _intruder(services: Services, group: str, instance: str) -> Consumer:
    """A consumer with the bridge's group and instance id: once it joins, Kafka fences the
    bridge's consumer (FENCED_INSTANCE_ID)."""
    return Consumer(
        {
            "bootstrap.servers": services.bootstrap,
            "group.id": group,
            "group.instance.id": instance,
            "session.timeout.ms": 6000,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )


@pytest.mark.parametrize("member", ["static", "own", "dynamic"])
def test_a_consumer_started_again_mid_stream_loses_nothing_and_takes_its_partitions_back(
    member: str,
    services: Services,
    topics: TopicFactory,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    overrides: dict[str, str] = {
        "static": {"kafka__group_instance_id": f"pod-{unique}"},  # the chart's StatefulSet
        "own": {},  # named after host and HTTP port (member_instance)
        "dynamic": {"kafka__static_membership": "false"},
    }[member]
    service, delay, target = _service(services, topics, unique, **overrides)
    everything = {Shard(delay, p) for p in range(3)}
    runner = threading.Thread(target=service.run)
    caplog.set_level(logging.INFO)
    runner.start()
    collector = Collector(services.bootstrap, [target], f"check-{unique}")
    try:
        wait_for(lambda: service.ingress.assigned == everything, 60, "the partitions assigned")

        def records(first: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
            return [
                (
                    b"k%d" % i,
                    b"v%d" % i,
                    [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"%dms" % (i % 50 * 20))],
                )
                for i in range(first, first + 300)
            ]

        produce_all(services.bootstrap, delay, records(0))
        service.ingress.restart_soon("a test")
        wait_for(
            lambda: "starting the delay-topic consumer again: a test" in caplog.text,
            30,
            "the consumer started again",
        )
        produce_all(services.bootstrap, delay, records(300))
        collector.until(
            lambda got: {r.value for r in got} >= {b"v%d" % i for i in range(600)},
            90,
            "all 600 records delivered",
        )
        assert service.ingress.assigned == everything
        service.ingress.restart_soon("again, within a minute")  # at most one a minute
        assert not service.ingress.restarts.why
    finally:
        service.stop_event.set()
        runner.join(60)
        collector.close()
    assert not runner.is_alive()


def test_a_static_consumer_fenced_fatally_starts_again_and_takes_its_partitions_back(
    services: Services, topics: TopicFactory, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka fails a static member fatally when Kafka fences it (FENCED_INSTANCE_ID): after a
    broker restart that outlasts its session, its commit of the lost assignment is fenced by its
    own new member id. Here another consumer with its instance id fences it. The ingress starts
    its consumer again (the instance id takes the partitions back), where it polled errors
    forever behind a green /healthz and delivered nothing more."""
    group, instance = f"g-{unique}", f"pod-{unique}"
    service, delay, target = _service(services, topics, unique, kafka__group_instance_id=instance)
    everything = {Shard(delay, p) for p in range(3)}
    runner = threading.Thread(target=service.run)
    caplog.set_level(logging.INFO)
    runner.start()
    collector = Collector(services.bootstrap, [target], f"check-{unique}")
    intruder = _intruder(services, group, instance)
    try:
        wait_for(lambda: service.ingress.assigned == everything, 60, "the partitions assigned")
        intruder.subscribe([delay])
        wait_for(
            lambda: intruder.poll(0.2) is None and bool(intruder.assignment()),
            60,
            "the intruder assigned the partitions",
        )
        wait_for(
            lambda: "starting the delay-topic consumer again" in caplog.text,
            60,
            "the fenced consumer started again",
        )
        intruder.close()
        records = [
            (b"k%d" % i, b"v%d" % i, [(H_TARGET_TOPIC, target.encode()), (H_AFTER, b"0ms")])
            for i in range(30)
        ]
        produce_all(services.bootstrap, delay, records)
        collector.until(
            lambda got: {r.value for r in got} >= {b"v%d" % i for i in range(30)},
            60,
            "the records produced after the fence delivered",
        )
        assert service.ingress.assigned == everything
        assert service.health() == []
    finally:
        service.stop_event.set()
        runner.join(60)
        collector.close()
    assert not runner.is_alive()


def _fenced(consumer: Consumer) -> bool:
    """Whether librdkafka failed ``consumer`` fatally (a commit says so without polling, which
    would hand the ingress the error)."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        return is_fatal(exc.args[0])
    return False


def test_a_restart_that_finds_its_consumer_fenced_closes_it_aside_and_joins_again(
    services: Services, topics: TopicFactory, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart asked for another reason (the unowned-partition watchdog's leave) whose consumer
    Kafka fenced meanwhile, before the ingress polled the fatal error: leaving the group fails
    fatally. The consumer is closed aside and a new one joins, where the ingress loop crashed
    and the bridge stopped (found by the adversary scenario, seed 111)."""
    group, instance = f"g-{unique}", f"pod-{unique}"
    service, delay, _ = _service(services, topics, unique, kafka__group_instance_id=instance)
    everything = {Shard(delay, p) for p in range(3)}
    ingress = service.ingress
    caplog.set_level(logging.INFO)
    intruder = _intruder(services, group, instance)
    try:
        ingress.subscribe()
        wait_for(
            lambda: ingress.poll_once(0.2) >= 0 and ingress.assigned == everything,
            60,
            "the partitions assigned",
        )
        intruder.subscribe([delay])
        wait_for(
            lambda: intruder.poll(0.2) is None and bool(intruder.assignment()),
            60,
            "the intruder assigned the partitions",
        )
        fenced = ingress.consumer
        wait_for(lambda: _fenced(fenced), 60, "the bridge's consumer fenced")
        ingress.restarts.leave("a test")
        ingress.poll_once(0.2)
        assert ingress.consumer is not fenced
        assert "leaving the group and joining it again: a test" in caplog.text
        intruder.close()
        wait_for(
            lambda: ingress.poll_once(0.2) >= 0 and ingress.assigned == everything,
            60,
            "the new consumer assigned the partitions",
        )
    finally:
        intruder.close()
        ingress.close()
