"""The bare pipe: the bridge's consume→produce hop with nothing in between — no parsing, no Redis.

``python -m bench.pipe CONFIG SOURCE TARGET COUNT`` consumes COUNT records from SOURCE and produces
each to TARGET with the client settings the bridge builds from CONFIG (so the same batching,
``linger.ms``, idempotence and acks), in batches read the way the bridge's ingress reads them. It
runs in a process of its own, like the bridge, and prints one JSON line: when the first record was
consumed and when the last delivery report came back (epoch ms).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml
from confluent_kafka import Consumer, KafkaError, Message, Producer

from bridge.config import consumer_settings, from_mapping, producer_settings
from bridge.kafka import produce


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def main(config_file: str, source: str, target: str, count: int) -> dict[str, int]:
    config = from_mapping(yaml.safe_load(Path(config_file).read_text()), env=dict(os.environ))
    consumer = Consumer(
        {**consumer_settings(config), "group.id": f"pipe-{source}", "auto.offset.reset": "earliest"}
    )
    producer = Producer(producer_settings(config))
    acked = failed = 0
    first_ms = 0

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal acked, failed
        if err is None:
            acked += 1
        else:
            failed += 1

    consumer.subscribe([source])
    consumed = 0
    deadline = time.monotonic() + 600
    while acked + failed < count and time.monotonic() < deadline:
        first = consumer.poll(0.05) if consumed < count else None
        if first is None:
            producer.poll(0.01 if consumed >= count else 0)
            continue
        batch = [first, *consumer.consume(config.ingress.batch_size - 1, 0)]
        first_ms = first_ms or now_ms()
        for msg in batch:
            if msg.error() is not None:
                continue
            produce(
                producer,
                target,
                value=msg.value(),
                key=msg.key(),
                headers=msg.headers(),
                on_delivery=report,
            )
            consumed += 1
        producer.poll(0)
    last_ms = now_ms()
    consumer.close()
    return {"first_ms": first_ms, "last_ms": last_ms, "acked": acked, "failed": failed}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
