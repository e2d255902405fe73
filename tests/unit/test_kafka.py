"""The produce helper every producer of the bridge goes through."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from bridge.kafka import produce


def test_a_value_the_client_cannot_take_is_a_refusal_of_that_record() -> None:
    # No broker is needed: the client refuses before queueing. The caller handles a
    # KafkaException per record (retried, then dead-lettered); a TypeError ended its loop.
    producer = Producer({"bootstrap.servers": "127.0.0.1:1"})
    with pytest.raises(KafkaException) as refused:
        produce(producer, "orders", value=12345)
    error = refused.value.args[0]
    assert error.code() == KafkaError._INVALID_ARG
    assert "TypeError" in error.str()


def test_a_full_queue_waits_for_room_and_every_record_is_queued() -> None:
    # One record fits; with no broker each times out of the queue in 100 ms, making room.
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "queue.buffering.max.messages": 1,
            "message.timeout.ms": 100,
            "log_level": 0,
        }
    )
    reports: list[KafkaError | None] = []
    for i in range(3):
        produce(producer, "orders", value=b"%d" % i, on_delivery=lambda e, _m: reports.append(e))
    producer.flush(5)
    assert len(reports) == 3
    assert all(e is not None and e.code() == KafkaError._MSG_TIMED_OUT for e in reports)
