"""Cancel records and the etf1 and kaspr dialects, read into the contract (pure: no Kafka, no Redis)."""

from __future__ import annotations

import re

import pytest

from bridge.dialects import parse_record
from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_DUE_AT,
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
    delay_topics=frozenset({"delay", "legacy", "kaspr", "kaspr-default"}),
    default_targets={"kaspr-default": "fallback"},
    allowed_targets=(re.compile(".*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("7d"),
    max_record_bytes=10_000,
    dialects={"legacy": "etf1", "kaspr": "kaspr", "kaspr-default": "kaspr"},
)


def read(
    headers: Headers, *, topic: str = "delay", key: bytes | None = b"k", value: bytes | None = b"v"
) -> Scheduled | Cancel:
    return parse_record(
        RULES,
        topic=topic,
        partition=1,
        offset=9,
        timestamp_ms=NOW,
        key=key,
        value=value,
        headers=headers,
        now_ms=NOW,
    )


def rejected(headers: Headers, **kwargs: bytes | str | None) -> Rejected:
    with pytest.raises(Rejected) as info:
        read(headers, **kwargs)  # type: ignore[arg-type]
    return info.value


# ------------------------------------------------------------------ delay-cancel


def test_a_cancel_names_the_id_and_schedules_nothing() -> None:
    assert read([(H_CANCEL, b"order-7")], value=None) == Cancel(9, "order-7")
    assert read([(H_CANCEL, "zahlung-ü".encode()), ("trace", b"x")]) == Cancel(9, "zahlung-ü")


def test_a_record_with_several_cancels_cancels_each_in_its_order() -> None:
    headers: Headers = [(H_CANCEL, b"a"), ("trace", b"x"), (H_CANCEL, b"b"), (H_CANCEL, b"a")]
    cancel = read(headers, value=None)
    assert isinstance(cancel, Cancel)
    assert [(c.offset, c.delay_id, c.due_ms) for c in cancel.each()] == [
        (9, "a", None),
        (9, "b", None),
        (9, "a", None),
    ]
    hinted = read([(H_CANCEL, b"a"), (H_DUE_AT, b"5"), (H_CANCEL, b"b"), (H_DUE_AT, b"7")])
    assert isinstance(hinted, Cancel)
    assert [(c.delay_id, c.due_ms, c.timestamp_ms) for c in hinted.each()] == [
        ("a", 5, NOW),
        ("b", 7, NOW),
    ]
    assert read([(H_CANCEL, b"a")]).each() == [Cancel(9, "a")]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ([(H_CANCEL, b"a"), (H_AFTER, b"0ms")], "must not carry delay-after"),
        ([(H_CANCEL, b"a"), (H_DELIVER_AT, b"2030-01-01T00:00:00Z")], "delay-deliver-at"),
        ([(H_CANCEL, b"a"), (H_TARGET_TOPIC, b"t")], "delay-target-topic"),
        ([(H_CANCEL, b"")], "delay-cancel must be 1 to 256 bytes"),
        ([(H_CANCEL, b"x" * 257)], "delay-cancel must be 1 to 256 bytes"),
        ([(H_CANCEL, b"\xff")], "delay-cancel is not valid UTF-8"),
        ([(H_CANCEL, b"a"), (H_CANCEL, b"")], "delay-cancel must be 1 to 256 bytes"),
        ([(H_CANCEL, b"a"), (H_CANCEL, b"\xff")], "delay-cancel is not valid UTF-8"),
        ([(H_CANCEL, b"a"), (H_CANCEL, b"b"), (H_DUE_AT, b"1")], "1 for 2"),
        ([(H_CANCEL, b"a"), (H_DUE_AT, b"1"), (H_DUE_AT, b"2")], "2 for 1"),
        ([(H_CANCEL, b"a"), (H_CANCEL, b"b"), (H_DUE_AT, b"1"), (H_DUE_AT, b"x")], "not 'x'"),
        ([(H_CANCEL, b"a"), (H_ID, b"x"), (H_ID, b"y")], "delay-id appears more than once"),
    ],
)
def test_a_bad_cancel_is_a_bad_header(headers: Headers, detail: str) -> None:
    rejection = rejected(headers)
    assert rejection.reason is Reason.BAD_HEADER
    assert detail in rejection.detail


# ------------------------------------------------------------------ etf1


def etf1(
    epoch: bytes = b"1790000100", target: bytes = b"orders.expired", **extra: bytes
) -> Headers:
    headers: Headers = [("scheduler-epoch", epoch), ("scheduler-target-topic", target)]
    return headers + [(k.replace("_", "-"), v) for k, v in extra.items()]


def test_an_etf1_record_is_scheduled_with_its_key_as_the_delay_id() -> None:
    rec = read(
        [*etf1(scheduler_target_key=b"o-1"), ("trace", b"t")],
        topic="legacy",
        key=b"timeout-o-1",
        value=b"payload",
    )
    assert isinstance(rec, Scheduled)
    assert rec.due_ms == 1_790_000_100_000  # unix seconds
    assert rec.target == "orders.expired"
    assert rec.delay_id == "timeout-o-1" and rec.given_id("legacy", 1) == "timeout-o-1"
    assert rec.delivered_key() == b"o-1"
    assert rec.value == b"payload"
    # Delivered as etf1 delivers it: the schedule's headers, then etf1's three (the schedule's
    # timestamp in unix seconds, its key and topic), then the bridge's own.
    assert rec.delivered_headers() == [
        *etf1(scheduler_target_key=b"o-1"),
        ("trace", b"t"),
        ("scheduler-timestamp", str(NOW // 1000).encode()),
        ("scheduler-key", b"timeout-o-1"),
        ("scheduler-topic", b"legacy"),
        (H_ID, b"timeout-o-1"),
        ("delay-due-at", b"1790000100000"),
    ]


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
        (
            etf1(epoch=b"1790000100000"),
            b"k",
            Reason.BAD_DUE_TIME,
            "scheduler-epoch 1790000100000 looks like milliseconds: etf1 takes unix seconds",
        ),
        ([("scheduler-epoch", b"1790000100")], b"k", Reason.MISSING_TARGET, "no delay-target"),
        (etf1(target=b"delay"), b"k", Reason.TARGET_NOT_ALLOWED, "is a delay topic"),
        ([*etf1(), ("scheduler-epoch", b"1")], b"k", Reason.BAD_HEADER, "more than once"),
    ],
)
def test_what_etf1_would_refuse_goes_to_the_dlq(
    headers: Headers, key: bytes | None, reason: Reason, detail: str
) -> None:
    rejection = rejected(headers, topic="legacy", key=key)
    assert rejection.reason is reason
    assert detail in rejection.detail


def test_etf1_headers_mean_nothing_on_a_delay_bridge_topic() -> None:
    assert rejected(etf1()).reason is Reason.MISSING_DUE_TIME


# ------------------------------------------------------------------ kaspr

# The example of Kaspr's user guide: due 2026-05-24T12:30:00Z; NOW is 2026-09-21.
GUIDE_AT = b"2026-05-24T12:30:00Z"
FUTURE_AT = b"2026-09-22T08:00:00Z"
FUTURE_MS = 1_790_064_000_000


def kaspr(
    action: bytes | None = None,
    *,
    at: bytes | None = FUTURE_AT,
    to: bytes | None = b"reminders-topic",
    rid: bytes | None = b"reminder-order-123",
    extra: Headers | None = None,
) -> Headers:
    headers: Headers = list(extra or [])
    for name, value in (
        ("x-scheduler-action", action),
        ("x-scheduler-deliver-to", to),
        ("x-scheduler-deliver-at", at),
        ("x-scheduler-request-id", rid),
    ):
        if value is not None:
            headers.append((name, value))
    return headers


def test_a_kaspr_add_is_scheduled_with_its_request_id_as_the_delay_id() -> None:
    rec = read(kaspr(extra=[("trace", b"t")]), topic="kaspr", key=b"order-123", value=b"{}")
    assert isinstance(rec, Scheduled)
    assert rec.due_ms == FUTURE_MS
    assert rec.target == "reminders-topic"
    assert rec.delay_id == "reminder-order-123"
    assert rec.delivered_key() == b"order-123"  # Kaspr delivers the record's own key
    # Kaspr delivers the headers without its x-scheduler-* ones; the bridge adds its own two.
    assert rec.delivered_headers() == [
        ("trace", b"t"),
        (H_ID, b"reminder-order-123"),
        ("delay-due-at", str(FUTURE_MS).encode()),
    ]
    assert read(kaspr(b"ADD"), topic="kaspr") == read(kaspr(), topic="kaspr")


def test_a_kaspr_add_without_a_request_id_gets_the_default_delay_id() -> None:
    rec = read(kaspr(rid=None), topic="kaspr")
    assert isinstance(rec, Scheduled) and rec.delay_id == "kaspr:1:9"


def test_a_kaspr_replace_is_a_schedule_with_the_same_id() -> None:
    rec = read(kaspr(b"REPLACE", at=b"2026-09-22T09:00:00Z"), topic="kaspr")
    assert isinstance(rec, Scheduled)
    assert rec.delay_id == "reminder-order-123" and rec.due_ms == FUTURE_MS + 3_600_000


def test_a_kaspr_cancel_names_only_its_request_id() -> None:
    cancel = Cancel(9, "reminder-order-123")
    assert read(kaspr(b"CANCEL", at=None, to=None), topic="kaspr") == cancel
    # Kaspr reads nothing else of a CANCEL: its time and target are ignored, not refused.
    assert read(kaspr(b"CANCEL"), topic="kaspr", value=None) == cancel


def test_a_past_kaspr_time_is_due_at_once() -> None:
    rec = read(kaspr(at=GUIDE_AT), topic="kaspr")
    assert isinstance(rec, Scheduled)
    assert rec.due_ms == 1_779_625_800_000 and rec.due_ms < NOW
    long_ago = read(kaspr(at=b"1990-01-01T00:00:00Z"), topic="kaspr")
    assert isinstance(long_ago, Scheduled) and long_ago.due_ms < NOW


@pytest.mark.parametrize(
    ("at", "due_ms"),
    [
        (b"2026-09-22T08:00:00Z", FUTURE_MS),
        (b"2026-09-22T08:00:00+00:00", FUTURE_MS),
        (b"2026-09-22T08:00:00", FUTURE_MS),  # no offset: UTC, as the guide says
        (b"2026-09-22 08:00:00", FUTURE_MS),
        (b"2026-09-22T10:00:00+02:00", FUTURE_MS),
        (b"2026-09-22T08:00:00.250Z", FUTURE_MS + 250),
        (b"2026-09-22T08:00:00.000001Z", FUTURE_MS + 1),  # rounded up: never early
        (b"2026-09-22", FUTURE_MS - 8 * 3_600_000),
    ],
)
def test_kaspr_times_are_iso_8601_in_utc(at: bytes, due_ms: int) -> None:
    rec = read(kaspr(at=at), topic="kaspr")
    assert isinstance(rec, Scheduled) and rec.due_ms == due_ms


def test_a_kaspr_topic_with_a_default_target_needs_no_deliver_to() -> None:
    rec = read(kaspr(to=None), topic="kaspr-default")
    assert isinstance(rec, Scheduled) and rec.target == "fallback"


@pytest.mark.parametrize(
    ("headers", "reason", "detail"),
    [
        (kaspr(at=None), Reason.MISSING_DUE_TIME, "no x-scheduler-deliver-at"),
        (kaspr(to=None), Reason.MISSING_TARGET, "no x-scheduler-deliver-to"),
        (kaspr(b"REPLACE", at=None), Reason.MISSING_DUE_TIME, "no x-scheduler-deliver-at"),
        (kaspr(b"REPLACE", to=None), Reason.MISSING_TARGET, "no x-scheduler-deliver-to"),
        (kaspr(b"REPLACE", rid=None), Reason.BAD_HEADER, "a REPLACE needs x-scheduler-request-id"),
        (kaspr(b"CANCEL", rid=None), Reason.BAD_HEADER, "a CANCEL needs x-scheduler-request-id"),
        (kaspr(b"CANCEL", rid=b""), Reason.BAD_HEADER, "a CANCEL needs x-scheduler-request-id"),
        (kaspr(b"cancel"), Reason.BAD_HEADER, "'cancel' is not ADD, REPLACE or CANCEL"),
        (kaspr(b"CRON_ADD"), Reason.BAD_HEADER, "cron schedules are not supported"),
        (kaspr(at=b"tomorrow"), Reason.BAD_DUE_TIME, "'tomorrow' is not an ISO 8601 time"),
        (kaspr(at=b"1790064000000"), Reason.BAD_DUE_TIME, "is not an ISO 8601 time"),
        (kaspr(at=b"2027-09-22T08:00:00Z"), Reason.DELAY_TOO_LONG, "limits.max_delay"),
        (kaspr(to=b"delay"), Reason.TARGET_NOT_ALLOWED, "is a delay topic"),
        (kaspr(rid=b"r" * 257), Reason.BAD_HEADER, "delay-id must be 1 to 256 bytes"),
        (kaspr(b"CANCEL", rid=b"r" * 257), Reason.BAD_HEADER, "must be 1 to 256 bytes"),
        (kaspr(to=b"\xff"), Reason.BAD_HEADER, "x-scheduler-deliver-to is not valid UTF-8"),
        (
            kaspr(extra=[("x-scheduler-deliver-at", FUTURE_AT)]),
            Reason.BAD_HEADER,
            "x-scheduler-deliver-at appears more than once",
        ),
    ],
)
def test_what_kaspr_would_refuse_goes_to_the_dlq(
    headers: Headers, reason: Reason, detail: str
) -> None:
    rejection = rejected(headers, topic="kaspr")
    assert rejection.reason is reason
    assert detail in rejection.detail


def test_kaspr_headers_mean_nothing_on_a_delay_bridge_topic() -> None:
    assert rejected(kaspr()).reason is Reason.MISSING_DUE_TIME
