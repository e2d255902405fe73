"""The test bed is real: a broker that speaks Kafka 4.x and a Redis that runs Lua."""

from __future__ import annotations

from typing import cast

import pytest
import redis
from confluent_kafka import Consumer, Producer

from tests.conftest import Services, TopicFactory
from tests.kafka_wire import api_versions

pytestmark = pytest.mark.integration

# MetadataVersion levels: 22 is 4.0-IV0, the first level of the Kafka 4 line (KRaft only).
FIRST_KAFKA_4_METADATA_LEVEL = 22


def test_broker_is_apache_kafka_4(services: Services) -> None:
    host, port = services.bootstrap.split(",")[0].rsplit(":", 1)
    apis = api_versions(host, int(port))
    assert 0 in apis.api_ranges and 1 in apis.api_ranges  # Produce, Fetch
    assert apis.finalized_features["metadata.version"] >= FIRST_KAFKA_4_METADATA_LEVEL


def test_produce_and_consume_with_headers(
    services: Services, topics: TopicFactory, unique: str
) -> None:
    topic = topics("smoke")
    producer = Producer({"bootstrap.servers": services.bootstrap, "enable.idempotence": True})
    reports: list[str | None] = []
    producer.produce(
        topic,
        key=b"k1",
        value=b"hello",
        headers=[("trace", b"abc"), ("trace", b"def")],
        on_delivery=lambda err, _msg: reports.append(None if err is None else str(err)),
    )
    assert producer.flush(10) == 0
    assert reports == [None]

    consumer = Consumer(
        {
            "bootstrap.servers": services.bootstrap,
            "group.id": f"smoke-{unique}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        msg = None
        for _ in range(100):
            msg = consumer.poll(0.5)
            if msg is not None:
                break
        assert msg is not None and msg.error() is None
        assert (msg.key(), msg.value()) == (b"k1", b"hello")
        assert msg.headers() == [("trace", b"abc"), ("trace", b"def")]
    finally:
        consumer.close()


def test_redis_runs_lua(redis_client: redis.Redis, unique: str) -> None:
    key = f"smoke:{unique}"
    script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('TIME')"
    result = cast(list[bytes], redis_client.eval(script, 1, key, "v"))
    assert redis_client.get(key) == b"v"
    assert len(result) == 2 and int(result[0]) > 1_700_000_000
