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
