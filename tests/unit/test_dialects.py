"""Cancel records and the etf1 dialect, read into the contract (pure: no Kafka, no Redis)."""

from __future__ import annotations

import re

import pytest

from bridge.dialects import parse_record
from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_ID,
    H_TARGET_TOPIC,
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    parse_duration_ms,
)

NOW = 1_790_000_000_000
RULES = Rules(
    delay_topics=frozenset({"delay", "legacy"}),
    default_targets={},
    allowed_targets=(re.compile(".*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("7d"),
    max_record_bytes=10_000,
    dialects={"legacy": "etf1"},
)


def read(headers: Headers, *, topic: str = "delay", key: bytes | None = b"k",
         value: bytes | None = b"v") -> Scheduled | Cancel:  # fmt: skip
    return parse_record(RULES, topic=topic, partition=1, offset=9, timestamp_ms=NOW, key=key,
                        value=value, headers=headers, now_ms=NOW)  # fmt: skip


def rejected(headers: Headers, **kwargs: bytes | str | None) -> Rejected:
    with pytest.raises(Rejected) as info:
        read(headers, **kwargs)  # type: ignore[arg-type]
    return info.value


# ------------------------------------------------------------------ delay-cancel


def test_a_cancel_names_the_id_and_schedules_nothing() -> None:
    assert read([(H_CANCEL, b"order-7")], value=None) == Cancel(9, "order-7")
    assert read([(H_CANCEL, "zahlung-ü".encode()), ("trace", b"x")]) == Cancel(9, "zahlung-ü")


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ([(H_CANCEL, b"a"), (H_AFTER, b"0ms")], "must not carry delay-after"),
        ([(H_CANCEL, b"a"), (H_DELIVER_AT, b"2030-01-01T00:00:00Z")], "delay-deliver-at"),
        ([(H_CANCEL, b"a"), (H_TARGET_TOPIC, b"t")], "delay-target-topic"),
        ([(H_CANCEL, b"")], "delay-cancel must be 1 to 256 bytes"),
        ([(H_CANCEL, b"x" * 257)], "delay-cancel must be 1 to 256 bytes"),
        ([(H_CANCEL, b"\xff")], "delay-cancel is not valid UTF-8"),
        ([(H_CANCEL, b"a"), (H_CANCEL, b"b")], "appears more than once"),
    ],
)
def test_a_bad_cancel_is_a_bad_header(headers: Headers, detail: str) -> None:
    rejection = rejected(headers)
    assert rejection.reason is Reason.BAD_HEADER
    assert detail in rejection.detail


# ------------------------------------------------------------------ etf1


def etf1(epoch: bytes = b"1790000100", target: bytes = b"orders.expired",
         **extra: bytes) -> Headers:  # fmt: skip
    headers: Headers = [("scheduler-epoch", epoch), ("scheduler-target-topic", target)]
    return headers + [(k.replace("_", "-"), v) for k, v in extra.items()]


def test_an_etf1_record_is_scheduled_with_its_key_as_the_delay_id() -> None:
    rec = read([*etf1(scheduler_target_key=b"o-1"), ("trace", b"t")], topic="legacy",
               key=b"timeout-o-1", value=b"payload")  # fmt: skip
    assert isinstance(rec, Scheduled)
    assert rec.due_ms == 1_790_000_100_000  # unix seconds
    assert rec.target == "orders.expired"
    assert rec.delay_id == "timeout-o-1" and rec.given_id("legacy", 1) == "timeout-o-1"
    assert rec.delivered_key() == b"o-1"
    assert rec.value == b"payload"
    # Delivered as etf1 delivers it: the schedule's headers, then etf1's three (the schedule's
    # timestamp in unix seconds, its key and topic), then the bridge's own.
    assert rec.delivered_headers() == [
        *etf1(scheduler_target_key=b"o-1"), ("trace", b"t"),
        ("scheduler-timestamp", str(NOW // 1000).encode()), ("scheduler-key", b"timeout-o-1"),
        ("scheduler-topic", b"legacy"), (H_ID, b"timeout-o-1"), ("delay-due-at", b"1790000100000"),
    ]  # fmt: skip


def test_without_a_target_key_the_delivered_key_is_null_as_with_etf1() -> None:
    rec = read(etf1(), topic="legacy", key=b"job")
    assert isinstance(rec, Scheduled) and rec.delivered_key() is None
    plain = read([(H_TARGET_TOPIC, b"t"), (H_AFTER, b"1s")], key=b"job")
    assert isinstance(plain, Scheduled) and plain.delivered_key() == b"job"  # the default stays


def test_an_etf1_tombstone_cancels_its_key() -> None:
    assert read(etf1(), topic="legacy", key=b"timeout-o-1", value=None) == Cancel(9, "timeout-o-1")
    assert read([], topic="legacy", key=b"timeout-o-1", value=None) == Cancel(9, "timeout-o-1")


def test_a_past_epoch_is_due_at_once() -> None:
    rec = read(etf1(epoch=b"0"), topic="legacy")
    assert isinstance(rec, Scheduled) and rec.due_ms < NOW


@pytest.mark.parametrize(
    ("headers", "key", "reason", "detail"),
    [
        (etf1(), None, Reason.BAD_HEADER, "needs a key"),
        (etf1(), b"\xff", Reason.BAD_HEADER, "must be UTF-8"),
        (etf1(), b"k" * 257, Reason.BAD_HEADER, "at most 256 bytes"),
        ([("scheduler-target-topic", b"t")], b"k", Reason.MISSING_DUE_TIME, "scheduler-epoch"),
        (etf1(epoch=b"1790000100.5"), b"k", Reason.BAD_DUE_TIME, "is not unix seconds"),
        (etf1(epoch=b"soon"), b"k", Reason.BAD_DUE_TIME, "is not unix seconds"),
        (etf1(epoch=b"9790000100"), b"k", Reason.DELAY_TOO_LONG, "limits.max_delay"),
        (etf1(epoch=b"1790000100000"), b"k", Reason.BAD_DUE_TIME,
         "scheduler-epoch 1790000100000 looks like milliseconds: etf1 takes unix seconds"),
        ([("scheduler-epoch", b"1790000100")], b"k", Reason.MISSING_TARGET, "no delay-target"),
        (etf1(target=b"delay"), b"k", Reason.TARGET_NOT_ALLOWED, "is a delay topic"),
        ([*etf1(), ("scheduler-epoch", b"1")], b"k", Reason.BAD_HEADER, "more than once"),
    ],
)  # fmt: skip
def test_what_etf1_would_refuse_goes_to_the_dlq(
    headers: Headers, key: bytes | None, reason: Reason, detail: str
) -> None:
    rejection = rejected(headers, topic="legacy", key=key)
    assert rejection.reason is reason
    assert detail in rejection.detail


def test_etf1_headers_mean_nothing_on_a_delay_bridge_topic() -> None:
    assert rejected(etf1()).reason is Reason.MISSING_DUE_TIME
