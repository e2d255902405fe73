"""When the delay-topic consumer is started again: the reasons, and which close a consumer aside."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError

from bridge.ingress.restarts import Restarts, is_fatal


def _restarts() -> Restarts:
    return Restarts(lambda: Consumer({"group.id": "unused"}))


def _fenced() -> KafkaError:
    return KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True)


def test_a_fatal_error_restarts_the_consumer_and_closes_it_aside() -> None:
    restarts = _restarts()
    restarts.failed(_fenced())
    assert restarts.why == "it failed fatally"
    assert restarts.fatal


def test_a_fatal_error_after_a_leave_was_asked_for_closes_the_consumer_aside_too() -> None:
    """The leave stays the reason; leaving the group cleanly is no longer possible."""
    restarts = _restarts()
    restarts.leave("a partition owned by no member")
    restarts.failed(_fenced())
    assert restarts.why == "a partition owned by no member"
    assert restarts.fatal


def test_what_counts_as_fatal() -> None:
    assert is_fatal(_fenced())
    assert is_fatal(KafkaError(KafkaError._FATAL, "Local: Fatal error"))
    assert not is_fatal(KafkaError(KafkaError._TRANSPORT, "broker down"))
