"""The wire contract: every header format and every DLQ reason, table-driven."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_CONTINUES,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ERROR,
    H_ERROR_DETAIL,
    H_EVERY,
    H_ID,
    H_MAX_LATENESS,
    H_MISSED,
    H_ORIGIN,
    H_PAUSE,
    H_PRIORITY,
    H_RESUME,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    H_TIMEZONE,
    H_UNTIL,
    Cancel,
    Headers,
    Priority,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    dead_letter_headers,
    dead_letter_reason,
    dead_letter_when_due,
    decode,
    encode,
    format_duration_ms,
    format_time_ms,
    parse,
    parse_duration_ms,
    parse_time_ms,
    parse_when,
    record_size,
)
from bridge.message.encoding import _decode_any

NOW = 1_790_000_000_000  # 2026-09-21T...Z
TS = NOW - 1_000

RULES = Rules(
    delay_topics=frozenset({"delay", "delay.slow"}),
    default_targets={"delay.slow": "reports"},
    allowed_targets=(re.compile(r"orders.*"), re.compile("reports")),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("7d"),
    max_record_bytes=1000,
)


def run(
    headers: Headers,
    *,
    topic: str = "delay",
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    timestamp_ms: int | None = TS,
) -> Scheduled:
    rec = parse(
        RULES,
        topic=topic,
        partition=2,
        offset=41,
        timestamp_ms=timestamp_ms,
        key=key,
        value=value,
        headers=headers,
        now_ms=NOW,
    )
    assert isinstance(rec, Scheduled)
    return rec


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1500", 1500),
        ("250ms", 250),
        ("30s", 30_000),
        ("15m", 900_000),
        ("2h", 7_200_000),
        ("7d", 604_800_000),
        ("1h30m", 5_400_000),
        ("1d2h3m4s5ms", 93_784_005),
        (" 45s ", 45_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "-5", "5x", "1.5s", "s", "30m1h", "1s1s", "1 h", "10sec", "1e3", "0x10"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


@given(st.integers(min_value=0, max_value=10**13))
def test_duration_format_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1790000000000", 1_790_000_000_000),
        ("2026-11-21T10:00:00Z", 1_795_255_200_000),
        ("2026-11-21T10:00:00z", 1_795_255_200_000),
        ("2026-11-21t10:00:00Z", 1_795_255_200_000),
        ("2026-11-21 10:00:00Z", 1_795_255_200_000),
        ("2026-11-21T18:00:00+08:00", 1_795_255_200_000),
        ("2026-11-21T04:30:00-05:30", 1_795_255_200_000),
        ("2026-11-21T10:00:00.5Z", 1_795_255_200_500),
        ("2026-11-21T10:00:00.123Z", 1_795_255_200_123),
        ("2026-11-21T10:00:00.123456789Z", 1_795_255_200_124),  # rounds up: never early
        ("2026-11-21T10:00:00.0001Z", 1_795_255_200_001),
        ("2016-12-31T23:59:60Z", 1_483_228_800_000),  # leap second
    ],
)
def test_times(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "tomorrow",
        "2026-11-21",
        "2026-11-21T10:00:00",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-11-21T25:00:00Z",
        "2026-11-21T10:00:00+24:00",
        "2026-11-21T10:00:00.Z",
        "1.5",
        "-1000",
        "99999999999999999",
        "2026-11-21T10:00:00Z trailing",
    ],
)
def test_bad_times(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time_ms(text)


def test_a_command_line_time_is_a_moment_or_a_duration_from_now() -> None:
    assert parse_when("2026-11-21T10:00:00Z", NOW) == 1_795_255_200_000
    assert parse_when("1795255200000", NOW, ago=True) == 1_795_255_200_000
    assert parse_when("1h", NOW) == parse_when("+1h", NOW) == NOW + 3_600_000
    assert parse_when("-30m", NOW) == NOW - 1_800_000
    assert parse_when("7d", NOW, ago=True) == NOW - 7 * 86_400_000
    assert parse_when("-7d", NOW, ago=True) == NOW + 7 * 86_400_000
    with pytest.raises(ValueError, match="looks like epoch seconds"):
        parse_when("1790000000", NOW)  # digits are epoch ms, never a duration
    for bad in ("yesterday", "", "-", "1h-", "--1h"):
        with pytest.raises(ValueError, match="not a time"):
            parse_when(bad, NOW)


def test_relative_delay_counts_from_record_timestamp() -> None:
    rec = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1h30m")])
    assert rec.due_ms == TS + 5_400_000
    assert run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1500")]).due_ms == TS + 1500


def test_record_without_timestamp_counts_from_now() -> None:
    rec = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")], timestamp_ms=None)
    assert rec.due_ms == NOW + 1000


def test_past_due_time_is_accepted_and_late_from_when_stored() -> None:
    rec = run([(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, b"1000000000000")])  # 2001
    assert rec.due_ms == 1_000_000_000_000 and rec.stored_ms == NOW
    # Lateness counts from when the bridge stored it, not from 2001.
    assert rec.late_from_ms() == NOW
    assert decode(encode(rec, "delay", 0), "delay", 0, rec.offset) == rec
    on_time = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1h")])
    assert on_time.stored_ms is None and on_time.late_from_ms() == on_time.due_ms


@pytest.mark.parametrize("text", ["1000", "1790000000", "946684799999"])
def test_epoch_seconds_taken_for_milliseconds_are_refused(text: str) -> None:
    with pytest.raises(Rejected) as caught:
        run([(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, text.encode())])
    assert caught.value.reason is Reason.BAD_DUE_TIME
    assert "looks like epoch seconds" in caught.value.detail
    assert parse_time_ms("946684800000") == 946_684_800_000  # 2000-01-01 itself is fine


def test_accepted_record_shape() -> None:
    headers: Headers = [
        ("trace", b"t1"),
        (H_TARGET_TOPIC, b"orders.eu"),
        (H_AFTER, b"5s"),
        (H_TARGET_KEY, b"\xff\x00key"),
        (H_ID, b"order-7"),
        ("nothing", None),
        (H_DUE_AT, b"1"),
    ]
    rec = run(headers)
    assert (rec.target, rec.offset, rec.delay_id) == ("orders.eu", 41, "order-7")
    assert rec.key == b"k"  # its own key is kept for the DLQ ...
    assert rec.delivered_key() == b"\xff\x00key"  # ... the target sees delay-target-key
    assert rec.delivered_headers() == [
        ("trace", b"t1"),
        ("nothing", None),
        (H_ID, b"order-7"),
        (H_DUE_AT, str(TS + 5000).encode()),
    ]


def test_default_delay_id_and_key() -> None:
    rec = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")])
    assert rec.delay_id == "delay:2:41"
    assert rec.delivered_key() == b"k"


def test_default_target_of_a_delay_topic() -> None:
    assert run([(H_AFTER, b"1s")], topic="delay.slow").target == "reports"


BAD_CASES = [
    ([(H_TARGET_TOPIC, b"orders")], Reason.MISSING_DUE_TIME),
    (
        [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_DELIVER_AT, b"1")],
        Reason.CONFLICTING_DUE_TIME,
    ),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"soon")], Reason.BAD_DUE_TIME),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"")], Reason.BAD_DUE_TIME),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, None)], Reason.BAD_DUE_TIME),
    ([(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, b"next week")], Reason.BAD_DUE_TIME),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"8d")], Reason.DELAY_TOO_LONG),
    # found by the chaos harness: a due time past the year 9999 crashed the detail's formatting
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"9" * 40)], Reason.DELAY_TOO_LONG),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"99999999999999d")], Reason.DELAY_TOO_LONG),
    (
        [(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, str(NOW + 8 * 86_400_000).encode())],
        Reason.DELAY_TOO_LONG,
    ),
    ([(H_AFTER, b"1s")], Reason.MISSING_TARGET),
    ([(H_TARGET_TOPIC, b""), (H_AFTER, b"1s")], Reason.MISSING_TARGET),
    ([(H_TARGET_TOPIC, b"orders/eu"), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"__consumer_offsets"), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"payments"), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"delay"), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"delay.dlq"), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"x" * 250), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b".."), (H_AFTER, b"1s")], Reason.TARGET_NOT_ALLOWED),
    ([(H_TARGET_TOPIC, b"orders\xff"), (H_AFTER, b"1s")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"\xc3\x28")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_ID, b"")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_ID, b"i" * 257)], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_ID, b"\xfe")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_AFTER, b"2s")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), ("pad", b"p" * 1000)], Reason.TOO_LARGE),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_PRIORITY, b"urgent")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_PRIORITY, b"")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_PRIORITY, b"0")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_PRIORITY, b"\xff")], Reason.BAD_HEADER),
    (
        [
            (H_TARGET_TOPIC, b"orders"),
            (H_AFTER, b"1s"),
            (H_PRIORITY, b"high"),
            (H_PRIORITY, b"low"),
        ],
        Reason.BAD_HEADER,
    ),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_MAX_LATENESS, b"soon")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_MAX_LATENESS, b"-1s")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_MAX_LATENESS, b"")], Reason.BAD_HEADER),
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_MAX_LATENESS, b"\xff")], Reason.BAD_HEADER),
    # A schedule that cannot be is refused, not delivered once as if it were a one-shot record.
    ([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_CRON, b"0 9 * * *")], Reason.BAD_SCHEDULE),
    ([(H_PAUSE, b"poll"), (H_RESUME, b"poll")], Reason.BAD_SCHEDULE),
    ([(H_PAUSE, b"poll"), (H_AFTER, b"1s")], Reason.BAD_SCHEDULE),
    ([(H_RESUME, b"")], Reason.BAD_SCHEDULE),
    ([(H_CANCEL, b"poll"), (H_CRON, b"@daily")], Reason.BAD_SCHEDULE),
]


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ([(H_PAUSE, b"poll")], "a delay-pause record changes a schedule and starts none: it "),
        ([(H_RESUME, b"p"), (H_EVERY, b"1m")], "a delay-resume record changes a schedule and "),
        ([(H_EVERY, b"1m"), (H_ID, b"x"), (H_CONTINUES, b"-1")], "delay-continues: an offset"),
        ([(H_AFTER, b"1s"), (H_COUNT, b"3")], "exactly one of delay-cron and delay-every"),
        ([(H_CRON, b"0 9 * * *")], "delay-id: a recurring schedule needs one of 1 to 256 bytes"),
        ([(H_CRON, b"* * * * *"), (H_EVERY, b"1m"), (H_ID, b"x")], "exactly one of delay-cron"),
        ([(H_CRON, b"0 9 * *"), (H_ID, b"x")], "delay-cron: '0 9 * *': Wrong number of fields"),
        ([(H_CRON, b"0 9 * * *"), (H_ID, b"x"), (H_TIMEZONE, b"Mars/Olympus")], "delay-timezone"),
        ([(H_EVERY, b"5 minutes"), (H_ID, b"x")], "delay-every: "),
        ([(H_EVERY, b"500ms"), (H_ID, b"x")], "delay-every: 500 ms is shorter than a second"),
        ([(H_EVERY, b"1m"), (H_ID, b"x"), (H_COUNT, b"0")], "delay-count: a positive integer"),
        ([(H_EVERY, b"1m"), (H_ID, b"x"), (H_UNTIL, b"soon")], "delay-until: "),
        ([(H_EVERY, b"1m"), (H_ID, b"x"), (H_MISSED, b"never")], "delay-missed: 'never'"),
        (
            [(H_EVERY, b"1m"), (H_ID, b"x"), (H_AFTER, b"1s"), (H_DELIVER_AT, b"1")],
            "both delay-deliver-at and delay-after are set",
        ),
        (
            [(H_EVERY, b"1m"), (H_ID, b"x"), (H_UNTIL, str(TS - 1).encode())],
            "no occurrence falls between its start and delay-until",
        ),
        ([(H_CRON, b"\xff"), (H_ID, b"x")], "header delay-cron is not valid UTF-8"),
    ],
)
def test_a_recurring_schedule_is_refused_saying_what_is_wrong_with_it(
    headers: Headers, detail: str
) -> None:
    """Each refusal names the header at fault."""
    with pytest.raises(Rejected) as info:
        run([(H_TARGET_TOPIC, b"orders"), *headers])
    assert info.value.reason is Reason.BAD_SCHEDULE
    assert info.value.detail.startswith(detail), info.value.detail


@pytest.mark.parametrize(
    ("headers", "first", "continues"),
    [
        # Weekdays at 09:00 in Paris: the first after the record's timestamp, in UTC.
        ([(H_CRON, b"0 9 * * 1-5"), (H_ID, b"digest"), (H_TIMEZONE, b"Europe/Paris")], None, None),
        ([(H_EVERY, b"5m"), (H_ID, b"poll"), (H_DELIVER_AT, str(NOW).encode())], NOW, None),
        ([(H_EVERY, b"5m"), (H_ID, b"poll"), (H_AFTER, b"1m")], TS + 60_000, None),
        (
            [
                (H_EVERY, b"5m"),
                (H_ID, b"poll"),
                (H_DELIVER_AT, str(NOW + 7).encode()),
                (H_CONTINUES, b"39"),
            ],
            NOW + 7,
            39,
        ),
    ],
)
def test_a_recurring_schedule_is_stored_due_at_its_first_occurrence(
    headers: Headers, first: int | None, continues: int | None
) -> None:
    """Its due-time headers say when its occurrences start; the record carrying one on says
    which record it continues."""
    got = run([(H_TARGET_TOPIC, b"orders"), *headers])
    assert isinstance(got, Scheduled) and got.recurring
    if first is None:
        assert format_time_ms(got.due_ms) == "2026-09-22T07:00:00.000Z"
    else:
        assert got.due_ms == first
    assert got.delay_id == (b"digest" if first is None else b"poll").decode()
    assert got.continues == continues
    assert got.target == "orders"


@pytest.mark.parametrize(("name", "pause"), [(H_PAUSE, True), (H_RESUME, False)])
def test_a_pause_or_a_resume_names_a_schedule_and_withdraws_nothing(name: str, pause: bool) -> None:
    got = parse(
        RULES,
        topic="delay",
        partition=2,
        offset=41,
        timestamp_ms=TS,
        key=b"k",
        value=None,
        headers=[(name, b"poll-partner")],
        now_ms=NOW,
    )
    assert got == Cancel(41, "poll-partner")
    assert isinstance(got, Cancel) and got.hold is pause and got.timestamp_ms == TS


@pytest.mark.parametrize(("headers", "reason"), BAD_CASES)
def test_rejections(headers: Headers, reason: Reason) -> None:
    with pytest.raises(Rejected) as info:
        run(headers)
    assert info.value.reason is reason
    assert info.value.detail and "\n" not in info.value.detail


@pytest.mark.parametrize(
    ("value", "priority"),
    [
        (None, Priority.NORMAL),
        (b"high", Priority.HIGH),
        (b"normal", Priority.NORMAL),
        (b"low", Priority.LOW),
        (b" High ", Priority.HIGH),
        (b"LOW", Priority.LOW),
    ],
)
def test_the_priority_header(value: bytes | None, priority: Priority) -> None:
    headers: Headers = [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), ("trace", b"t")]
    if value is not None:
        headers.append((H_PRIORITY, value))
    rec = run(headers)
    assert rec.priority is priority
    assert rec.delivered_headers()[0] == ("trace", b"t")  # stripped on delivery, as every delay-*
    assert H_PRIORITY not in dict(rec.delivered_headers())


def test_a_bad_priority_names_the_values_it_takes() -> None:
    with pytest.raises(Rejected) as info:
        run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_PRIORITY, b"urgent")])
    assert info.value.detail == "delay-priority must be one of high, normal, low, not 'urgent'"


def test_a_max_lateness_is_kept_with_the_record_and_sets_when_it_expires() -> None:
    headers: Headers = [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s"), (H_MAX_LATENESS, b"1h30m")]
    rec = run(headers)
    back = decode(encode(rec, "delay", 2), "delay", 2, rec.offset)
    assert back == rec and back.expires_ms(60_000) == rec.due_ms + 5_400_000
    assert len(encode(rec, "delay", 2)) < len(encode(run(headers[:2]), "delay", 2)) + 10  # a code
    assert H_MAX_LATENESS not in dict(rec.delivered_headers())
    assert run(headers[:2]).expires_ms(60_000) == rec.due_ms + 60_000
    assert run(headers[:2]).expires_ms(0) is None
    assert run([*headers[:2], (H_MAX_LATENESS, b"0")]).expires_ms(60_000) is None


def test_a_cancel_may_carry_the_due_time_of_its_record_as_a_hint() -> None:
    def cancel(*more: tuple[str, bytes | None]) -> Scheduled | Cancel:
        return parse(
            RULES,
            topic="delay",
            partition=2,
            offset=41,
            timestamp_ms=TS,
            key=b"k",
            value=b"",
            headers=[(H_CANCEL, b"delay:2:7"), *more],
            now_ms=NOW,
        )

    hinted = cancel((H_DUE_AT, b"1790000000000"))
    assert isinstance(hinted, Cancel) and hinted.due_ms == 1_790_000_000_000
    assert hinted == Cancel(41, "delay:2:7") and cancel() == Cancel(41, "delay:2:7")
    assert cast(Cancel, cancel()).due_ms is None
    for bad in (b"soon", b"-1", b""):
        with pytest.raises(Rejected) as info:
            cancel((H_DUE_AT, bad))
        assert info.value.reason is Reason.BAD_HEADER and "epoch milliseconds" in info.value.detail


def test_every_reason_is_covered() -> None:
    # delivery-failed: test_pipeline.py; payload-missing: below and test_read_back.py; expired:
    # test_deliveries.py and test_pipeline.py; quota-exceeded: test_quotas.py
    covered = {reason for _, reason in BAD_CASES} | {
        Reason.DELIVERY_FAILED,
        Reason.PAYLOAD_MISSING,
        Reason.EXPIRED,
        Reason.QUOTA_EXCEEDED,
    }
    assert covered == set(Reason)


def test_a_record_bound_for_the_dlq_at_its_due_time_keeps_its_reason_when_stored() -> None:
    gone = dead_letter_when_due(
        "delay",
        3,
        42,
        1_800_000_000_000,
        reason=Reason.PAYLOAD_MISSING,
        detail="offset 42 was gone",
    )
    back = decode(encode(gone, "delay", 3), "delay", 3, 42)
    assert back == gone and back.dead_letter and back.key is None and back.value is None
    assert dead_letter_reason(back.headers) == "payload-missing"
    assert dict(back.headers)[H_ORIGIN] == b"delay:3:42"
    refused = dead_letter_when_due(
        "delay",
        3,
        43,
        1,
        reason=Reason.TARGET_NOT_ALLOWED,
        detail="not now",
        message=(b"k", b"v", [(H_TARGET_TOPIC, b"x")]),
    )
    assert refused.headers[0] == (H_TARGET_TOPIC, b"x") and refused.value == b"v"
    assert not Scheduled(1, 1, "out", None, None, [], "id").dead_letter


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ([(H_AFTER, b"\xff"), (H_TARGET_TOPIC, b"\xfe")], H_TARGET_TOPIC),
        ([(H_PRIORITY, b"\xff"), (H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")], H_PRIORITY),
        ([(H_MAX_LATENESS, b"\xff"), (H_ID, b"\xfe"), (H_TARGET_TOPIC, b"o")], H_ID),
    ],
)
def test_a_header_that_is_not_utf8_is_named_in_the_order_headers_are_checked(
    headers: Headers, named: str
) -> None:
    # Whatever order the record carries them in: the target, the due time, the delay-id, ...
    with pytest.raises(Rejected) as exc:
        run(headers)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.BAD_HEADER,
        f"header {named} is not valid UTF-8",
    )


def test_too_large_counts_key_value_and_headers() -> None:
    base: Headers = [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")]
    overhead = sum(len(k) + len(v or b"") for k, v in base)
    run(base, key=b"k", value=b"v" * (1000 - overhead - 1))
    with pytest.raises(Rejected):
        run(base, key=b"kk", value=b"v" * (1000 - overhead - 1))


def test_dead_letter_headers() -> None:
    out = dead_letter_headers([("a", b"1")], Reason.BAD_DUE_TIME, "bad\nthing", "delay:1:2")
    assert out == [
        ("a", b"1"),
        (H_ERROR, b"bad-due-time"),
        (H_ERROR_DETAIL, b"bad thing"),
        (H_ORIGIN, b"delay:1:2"),
    ]


headers_st = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50))), max_size=6
)


@given(
    offset=st.integers(0, 2**62),
    due=st.integers(0, 2**53),
    target=st.text(min_size=1, max_size=30),
    key=st.one_of(st.none(), st.binary(max_size=40)),
    value=st.one_of(st.none(), st.binary(max_size=200)),
    headers=headers_st,
    delay_id=st.text(min_size=1, max_size=40),
    priority=st.sampled_from(Priority),
)
def test_encoding_round_trips(
    offset: int,
    due: int,
    target: str,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    delay_id: str,
    priority: Priority,
) -> None:
    for rec in (
        Scheduled(offset, due, target, key, value, headers, delay_id),
        Scheduled(offset, due, target, key, value, headers, delay_id, priority=priority),
        # What the compact form leaves out: a target from the header, the default delay-id.
        Scheduled(
            offset,
            due,
            target,
            key,
            value,
            [*headers, (H_TARGET_TOPIC, target.encode())],
            f"delay:3:{offset}",
        ),
        # ... and a caller's delay-id from its header.
        Scheduled(offset, due, target, key, value, [(H_ID, delay_id.encode()), *headers], delay_id),
    ):
        assert decode(encode(rec, "delay", 3), "delay", 3, offset) == rec


def _fields(rec: Scheduled) -> tuple[object, ...]:
    return tuple(getattr(rec, name) for name in Scheduled.__slots__)


@given(
    target=st.text(max_size=30),
    key=st.one_of(st.none(), st.binary(max_size=40)),
    value=st.one_of(st.none(), st.binary(max_size=200)),
    headers=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from([H_TARGET_TOPIC, H_ID, H_CRON, H_AFTER]), st.text(max_size=8)
            ),
            st.one_of(st.none(), st.binary(max_size=20)),
        ),
        max_size=5,
    ),
    delay_id=st.sampled_from(["delay:3:7", "own", ""]),
    stored_ms=st.one_of(st.none(), st.integers(0, 2**53)),
    priority=st.sampled_from(Priority),
    damage=st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 255)),
)
def test_the_narrow_decoding_reads_what_the_general_one_reads(
    target: str,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    delay_id: str,
    stored_ms: int | None,
    priority: Priority,
    damage: tuple[int, int, int],
) -> None:
    # decode reads the narrow form inline and hands the rest to _decode_any: both read every
    # field alike, and refuse alike what does not decode (a blob cut short, a byte changed).
    rec = Scheduled(7, NOW, target, key, value, headers, delay_id, stored_ms, priority=priority)
    blob = encode(rec, "delay", 3)
    cut, at, byte = damage
    changed = blob[:at] + bytes([byte]) + blob[at + 1 :] if at < len(blob) else blob
    for stored in (blob, blob[:cut], changed, blob + b"x"):
        try:
            general = _fields(_decode_any(stored, "delay", 3, 7))
        except ValueError:
            with pytest.raises(ValueError):
                decode(stored, "delay", 3, 7)
        else:
            assert _fields(decode(stored, "delay", 3, 7)) == general


def test_long_fields_round_trip() -> None:
    rec = Scheduled(7, NOW, "t", b"k" * 70_000, b"v" * 200_000, [("h", b"x" * 66_000)], "i")
    assert decode(encode(rec, "delay", 0), "delay", 0, 7) == rec


@pytest.mark.parametrize("count", [65_535, 65_536, 70_000])
def test_any_number_of_headers_round_trips(count: int) -> None:
    # Kafka sets no limit on a record's headers; 70,000 empty ones fit in 350 kB. (Once a count
    # above 65,535 stopped the ingress: the stored form had two bytes for it.)
    headers: Headers = [(H_TARGET_TOPIC, b"orders"), *[("", None)] * (count - 1)]
    rec = Scheduled(7, NOW, "orders", None, b"v", headers, "delay:0:7")
    stored = encode(rec, "delay", 0)
    assert decode(stored, "delay", 0, 7) == rec
    # Up to 65,535 the form is the one stored before larger counts were possible.
    assert (struct.unpack_from(">H", stored, 10)[0] == count) is (count <= 65_535)


def test_encoding_is_compact() -> None:
    headers: Headers = [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"30s"), ("trace", b"t1")]
    rec = Scheduled(41, NOW, "orders", b"k", b"v" * 100, headers, "delay:2:41")
    payload = record_size(rec.key, rec.value, headers)
    # 12 (version, flags, due ms, header count) + key 2+1 + value 2+100 + target header 1+2+6
    # + delay-after 1+2+3 + trace 1+2+5+2+2: less than the record, as known names take a byte
    # and the target and the default delay-id are not repeated.
    assert len(encode(rec, "delay", 2)) == 144 < payload


def test_a_priority_costs_no_byte() -> None:
    rec = Scheduled(41, NOW, "orders", b"k", b"v", [], "delay:2:41")
    for priority in Priority:  # a flag bit: a normal record is stored as before lanes existed
        stored = encode(
            Scheduled(41, NOW, "orders", b"k", b"v", [], "delay:2:41", priority=priority),
            "delay",
            2,
        )
        assert len(stored) == len(encode(rec, "delay", 2))
        assert (stored == encode(rec, "delay", 2)) is (priority is Priority.NORMAL)


def test_a_caller_delay_id_is_stored_once() -> None:
    with_id = Scheduled(
        41, NOW, "orders", b"k", b"v", [(H_ID, b"expire-order-42")], "expire-order-42"
    )
    without = Scheduled(41, NOW, "orders", b"k", b"v", [], "delay:2:41")
    # The header (a 1-byte name code, 2 + 15 bytes of value), not the id a second time.
    assert len(encode(with_id, "delay", 2)) - len(encode(without, "delay", 2)) == 1 + 2 + 15


@pytest.mark.parametrize(
    "damage",
    [lambda b: b"\x09" + b[1:], lambda b: b"\x01" + b[1:], lambda b: b[:-1], lambda b: b + b"x"],
)
def test_decode_refuses_what_it_does_not_understand(damage: Callable[[bytes], bytes]) -> None:
    blob = encode(Scheduled(1, 2, "t", None, b"v", [("h", b"1")], "i"), "delay", 0)
    with pytest.raises(ValueError):
        decode(damage(blob), "delay", 0, 1)


_CONTROL_NAMES = [H_TARGET_TOPIC, H_AFTER, H_DELIVER_AT, H_ID, "delay-target-key", "other"]
_hostile_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(-(2**80), 2**80).map(lambda n: str(n).encode()),
    st.from_regex(r"[0-9]{1,30}(ms|s|m|h|d)", fullmatch=True).map(str.encode),
    st.from_regex(
        r"[0-9]{1,6}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,12})?"
        r"(Z|[+-][0-9]{2}:[0-9]{2})",
        fullmatch=True,
    ).map(str.encode),
)


@settings(max_examples=500)
@given(
    headers=st.lists(st.tuples(st.sampled_from(_CONTROL_NAMES), _hostile_values), max_size=6),
    timestamp=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
def test_any_headers_give_a_schedule_or_a_rejection(
    headers: Headers, timestamp: int | None
) -> None:
    """Whatever the headers, parse returns or raises Rejected — never another exception that
    would stop the ingress loop on a poison record."""
    try:
        rec = run(headers, timestamp_ms=timestamp)
    except Rejected as rejected:
        assert rejected.detail and "\n" not in rejected.detail
    else:
        assert rec.due_ms - NOW <= 7 * 86_400_000


def test_a_default_delay_id_is_known_for_its_own_partition_only() -> None:
    """The parser and the decoder mark a default delay-id with the partition it belongs to, so
    ``given_id`` need not build it per record; asked about another partition, it still compares."""
    rec = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1h")])
    assert rec.delay_id == "delay:2:41" and rec.default_of == ("delay", 2)
    assert rec.given_id("delay", 2) is None
    assert rec.given_id("delay", 0) == "delay:2:41"
    stored = decode(encode(rec, "delay", 2), "delay", 2, rec.offset)
    assert stored == rec and stored.default_of == ("delay", 2)
    given = run([(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1h"), (H_ID, b"order-7")])
    assert given.default_of is None and given.given_id("delay", 2) == "order-7"
    assert decode(encode(given, "delay", 2), "delay", 2, 41).default_of is None
