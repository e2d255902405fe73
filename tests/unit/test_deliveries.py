"""The decisions Deliveries makes on delivery reports — acknowledge, retry after a back-off,
dead-letter, send a DLQ copy without its value, keep a record bound for the DLQ, drain — and the
Sender's (records claimed ahead produced at their due time, never before; released at shutdown),
with a producer and a store that only record what they are asked (the real ones: the
integration tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import KafkaError, Producer
from prometheus_client import CollectorRegistry

from bridge.config import EgressConfig
from bridge.egress.failures import Ident, InFlight
from bridge.egress.plan import DecisionClock
from bridge.egress.sender import Sender
from bridge.egress.settle import Deliveries
from bridge.health import Readiness
from bridge.message import (
    H_ERROR,
    H_ERROR_DETAIL,
    H_MAX_LATENESS,
    H_ORIGIN,
    Reason,
    Scheduled,
    dead_letter_when_due,
)
from bridge.metrics import Metrics
from bridge.store import AckBatch, Claimed, Claims, Shard, Store, offset_bytes

SHARD = Shard("delay", 0)
NOW = 1_800_000_000_000


@dataclass
class Sent:
    topic: str
    value: bytes | None
    headers: dict[str, bytes | None]
    report: Any  # on_delivery(err, msg)


@dataclass
class Placed:
    """A delivery report's message: where Kafka put the record."""

    at_partition: int
    at_offset: int

    def partition(self) -> int:
        return self.at_partition

    def offset(self) -> int:
        return self.at_offset


@dataclass
class FakeProducer:
    sent: list[Sent] = field(default_factory=list)

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: Any,
        **_: Any,
    ) -> None:
        self.sent.append(Sent(topic, value, dict(headers), on_delivery))

    def flush(self, _timeout: float) -> int:
        return 0


@dataclass
class FakeStore:
    released: list[tuple[dict[Shard, list[bytes]], int]] = field(default_factory=list)
    acked: list[dict[Shard, list[bytes]]] = field(default_factory=list)

    def release(self, members: Mapping[Shard, Sequence[bytes]], retry_in_ms: int = 0) -> int:
        self.released.append(({s: list(m) for s, m in members.items()}, retry_in_ms))
        return sum(len(m) for m in members.values())

    def ack(self, acks: Mapping[Shard, AckBatch]) -> int:
        self.acked.append({s: list(a.members) for s, a in acks.items()})
        return sum(len(a.members) for a in acks.values())


class Setup:
    def __init__(self, max_attempts: int = 2, max_lateness: int = 0) -> None:
        self.producer, self.store = FakeProducer(), FakeStore()
        self.retried: list[tuple[dict[Shard, list[bytes]], int]] = []
        self.config = EgressConfig(
            max_attempts=max_attempts, tick=0, send_tick=0, ahead=0, max_lateness=max_lateness
        )
        self.metrics = Metrics(CollectorRegistry())
        self.deliveries = Deliveries(
            cast(Producer, self.producer),
            cast(Store, self.store),
            self.metrics,
            Readiness(),
            self.config,
            dead_letter="delay.dlq",
            clock_ms=lambda: NOW,
            on_retry=lambda members, wait: self.retried.append(
                ({s: list(m) for s, m in members.items()}, wait)
            ),
        )

    def claim(
        self,
        offset: int,
        value: bytes = b"v",
        *,
        due_ms: int = NOW,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Ident:
        record = Scheduled(offset, due_ms, "orders", b"k", value, [("h", b"1"), *headers], "id")
        ident = (SHARD, offset_bytes(offset))
        inflight = self.deliveries.track(ident, Claimed(SHARD, ident[1], record, False), False)
        self.deliveries.produce(ident, inflight)
        return ident

    def report(self, error: int | None) -> None:
        """The last record produced gets its delivery report; the mover applies it."""
        err = None if error is None else KafkaError(error, "refused")
        self.producer.sent[-1].report(err, Placed(0, len(self.producer.sent)))
        self.deliveries.apply_reports()


def test_a_delivered_record_is_acknowledged_and_leaves_the_records_in_flight() -> None:
    s = Setup()
    ident = s.claim(7)
    s.report(None)
    s.deliveries.ack(force=True)
    assert s.store.acked == [{SHARD: [ident[1]]}]
    assert not s.deliveries.in_flight


def test_a_permanent_refusal_is_retried_then_dead_lettered_with_kafkas_error() -> None:
    s = Setup(max_attempts=2)
    ident = s.claim(7)
    s.report(KafkaError.UNKNOWN_TOPIC_OR_PART)  # attempt 1: produced again at once
    assert [x.topic for x in s.producer.sent] == ["orders", "orders"]
    s.report(KafkaError.UNKNOWN_TOPIC_OR_PART)  # attempt 2 of 2: the DLQ's turn
    dlq = s.producer.sent[-1]
    assert dlq.topic == "delay.dlq" and dlq.value == b"v"
    assert dlq.headers[H_ERROR] == b"delivery-failed"
    assert dlq.headers[H_ORIGIN] == b"delay:0:7"
    assert b"delivery to orders failed 2 times: UNKNOWN_TOPIC_OR_PART" in (
        dlq.headers[H_ERROR_DETAIL] or b""
    )
    s.report(None)
    s.deliveries.ack(force=True)
    assert s.store.acked == [{SHARD: [ident[1]]}] and not s.store.released


def test_a_dlq_copy_too_large_goes_again_without_its_value() -> None:
    s = Setup(max_attempts=1)
    s.claim(7, value=b"x" * 5000)
    s.report(KafkaError.MSG_SIZE_TOO_LARGE)  # the target refuses it: to the DLQ
    s.report(KafkaError.MSG_SIZE_TOO_LARGE)  # the DLQ refuses the copy too
    copy = s.producer.sent[-1]
    assert copy.topic == "delay.dlq" and copy.value is None
    assert b"value of 5000 bytes left out" in (copy.headers[H_ERROR_DETAIL] or b"")


def test_a_transient_failure_ends_the_lease_after_a_doubling_back_off() -> None:
    s = Setup()
    ident = s.claim(7)
    s.report(KafkaError._MSG_TIMED_OUT)
    assert s.store.released == [({SHARD: [ident[1]]}, 500)]
    assert s.retried == [({SHARD: [ident[1]]}, 500)]
    assert not s.deliveries.in_flight  # claimed again after the back-off
    s.claim(7)  # claimed again
    s.report(KafkaError._MSG_TIMED_OUT)
    assert s.store.released[-1] == ({SHARD: [ident[1]]}, 1000)


def test_a_record_whose_dlq_copy_failed_goes_to_the_dlq_again_when_claimed_again() -> None:
    s = Setup(max_attempts=1)
    s.claim(7)
    s.report(KafkaError.UNKNOWN_TOPIC_OR_PART)  # given up: to the DLQ
    s.report(KafkaError._MSG_TIMED_OUT)  # the DLQ copy times out: released
    s.claim(7)  # claimed again after the back-off: its attempts stay spent
    assert s.producer.sent[-1].topic == "delay.dlq"


def test_drain_releases_what_kafka_never_acknowledged() -> None:
    s = Setup()
    ident = s.claim(7)
    s.deliveries.drain(deadline=0.0)  # shutting down, no report came
    assert s.store.released == [({SHARD: [ident[1]]}, 0)]
    assert not s.deliveries.in_flight


def test_a_record_stored_bound_for_the_dlq_goes_there_with_its_own_reason() -> None:
    s = Setup()
    record = dead_letter_when_due("delay", 0, 7, NOW, reason=Reason.PAYLOAD_MISSING, detail="gone")
    ident = (SHARD, offset_bytes(7))
    inflight: InFlight = s.deliveries.track(ident, Claimed(SHARD, ident[1], record, False), False)
    s.deliveries.produce(ident, inflight)
    sent = s.producer.sent[-1]
    assert sent.topic == "delay.dlq" and sent.headers[H_ERROR] == b"payload-missing"


def test_a_record_later_than_its_max_lateness_goes_to_the_dlq_as_expired_with_its_payload() -> None:
    s = Setup(max_lateness=60_000)
    ident = s.claim(7, due_ms=NOW - 60_001)  # a minute and a millisecond late: expired
    sent = s.producer.sent[-1]
    assert sent.topic == "delay.dlq" and sent.value == b"v" and sent.headers["h"] == b"1"
    assert sent.headers[H_ERROR] == b"expired" and sent.headers[H_ORIGIN] == b"delay:0:7"
    assert sent.headers[H_ERROR_DETAIL] == (
        b"1m1ms past its due time 2027-01-15T07:58:59.999Z: later than its max lateness (1m) "
        b"allows; bound for orders"
    )
    s.report(None)
    fate = json.loads(s.deliveries.in_flight[ident].fate(NOW, "delay.dlq"))
    assert fate["fate"] == "expired" and fate["reason"] == "expired"
    s.deliveries.ack(force=True)
    assert s.store.acked == [{SHARD: [ident[1]]}]
    assert s.metrics.expired.labels(target_topic="orders")._value.get() == 1
    assert s.metrics.dead_lettered.labels(reason="expired")._value.get() == 1
    s.claim(8, due_ms=NOW - 60_000)  # a minute late exactly: still delivered
    assert s.producer.sent[-1].topic == "orders"


def test_a_records_own_max_lateness_overrides_the_default_and_0_means_never() -> None:
    s = Setup(max_lateness=60_000)
    s.claim(7, due_ms=NOW - 3_600_000, headers=[(H_MAX_LATENESS, b"2h")])
    s.claim(8, due_ms=NOW - 86_400_000, headers=[(H_MAX_LATENESS, b"0")])
    s.claim(9, due_ms=NOW - 2, headers=[(H_MAX_LATENESS, b"1ms")])
    assert [x.topic for x in s.producer.sent] == ["orders", "orders", "delay.dlq"]
    assert H_MAX_LATENESS not in s.producer.sent[0].headers  # a control header: not delivered
    s = Setup()  # no default: only a record's own header expires it
    s.claim(7, due_ms=NOW - 86_400_000)
    s.claim(8, due_ms=NOW - 1_001, headers=[(H_MAX_LATENESS, b"1s")])
    assert [x.topic for x in s.producer.sent] == ["orders", "delay.dlq"]


def test_an_expired_record_whose_dlq_copy_failed_stays_expired_when_claimed_again() -> None:
    s = Setup(max_lateness=1000)
    s.claim(7, due_ms=NOW - 5000)
    s.report(KafkaError._MSG_TIMED_OUT)  # the DLQ copy times out: released
    s.claim(7, due_ms=NOW - 5000)
    assert s.producer.sent[-1].headers[H_ERROR] == b"expired"


def _sender(s: Setup) -> Sender:
    return Sender(s.config, DecisionClock(), s.deliveries)


def _claims(now_ms: int, dues: list[tuple[int, int]]) -> Claims:
    records = [
        Claimed(
            SHARD, offset_bytes(o), Scheduled(o, due, "orders", b"k", b"%d" % o, [], "id"), False
        )
        for o, due in dues
    ]
    return Claims(records, now_ms, {}, 0.0, now_ms)


def test_records_claimed_ahead_are_produced_at_their_due_time_never_before() -> None:
    s = Setup()
    sender = _sender(s)
    # Claimed at NOW: offset 1 is due, 2 and 3 are due later (3 before 2).
    sender.dispatch(_claims(NOW, [(1, NOW), (2, NOW + 200), (3, NOW + 100)]), set(), None)
    assert [x.value for x in s.producer.sent] == [b"1"] and len(sender) == 2
    sender.send_due(NOW + 99)
    assert len(s.producer.sent) == 1  # nothing early
    sender.send_due(NOW + 100)
    sender.send_due(NOW + 250)
    assert [x.value for x in s.producer.sent] == [b"1", b"3", b"2"] and len(sender) == 0


def test_records_held_at_shutdown_are_released_for_the_next_owner() -> None:
    s = Setup()
    sender = _sender(s)
    sender.dispatch(
        _claims(NOW, [(1, NOW + 500), (2, NOW + 600)]), {(SHARD, offset_bytes(2))}, None
    )  # offset 2 was put back: not held
    sender.release()
    assert s.store.released == [({SHARD: [offset_bytes(1)]}, 0)]
    assert not s.deliveries.in_flight and not s.producer.sent
