"""What every producer of the bridge (and its test and bench load) does the same way."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

QUEUE_FULL_WAIT_S = 0.05


def produce(producer: Producer, topic: str, **fields: Any) -> None:
    """``Producer.produce``, waiting for delivery reports to make room while librdkafka's local
    queue is full. Other errors (e.g. a record over ``message.max.bytes``) are the caller's."""
    while True:
        try:
            producer.produce(topic, **fields)
            return
        except BufferError:
            producer.poll(QUEUE_FULL_WAIT_S)
