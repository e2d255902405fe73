"""A recurring schedule's arithmetic (bridge.message.recurrence): occurrences in five zones across both of
a year's clock changes, with every expected instant written out; intervals; missed occurrences;
what is refused; and properties over expressions, zones and starts drawn at random."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.message.recurrence import MACROS, BadSchedule, Fire, Missed, Recurrence


def ms(text: str) -> int:
    """An RFC 3339 time as epoch ms."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def utc(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")


def cron(expression: str, zone: str, start: str) -> Recurrence:
    return Recurrence.of(cron=expression, every_ms=None, zone=zone, start_ms=ms(start))


def occurrences(expression: str, zone: str, start: str, n: int) -> list[str]:
    """The first ``n`` occurrences at or after ``start``, in UTC."""
    schedule = cron(expression, zone, start)
    return [utc(t) for t in schedule.upcoming(schedule.start_ms - 1, n)]


# (expression, zone, from, the occurrences in UTC): each zone's spring-forward and fall-back of
# 2026, a local time in the gap (fires at the first instant after it) and one repeated (fires
# once, at its first occurrence), and two zones without DST.
CASES = [
    # Paris: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
    (
        "30 2 * * *",
        "Europe/Paris",
        "2026-03-28T00:00+01:00",
        ["2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"],
    ),
    (
        "30 2 * * *",
        "Europe/Paris",
        "2026-10-24T00:00+02:00",
        ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"],
    ),
    (
        "*/30 * * * *",
        "Europe/Paris",
        "2026-10-25T01:45+02:00",
        ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T02:00Z", "2026-10-25T02:30Z"],
    ),
    (  # the daily digest at 09:00 Paris on weekdays, across the spring change
        "0 9 * * 1-5",
        "Europe/Paris",
        "2026-03-27T00:00+01:00",
        ["2026-03-27T08:00Z", "2026-03-30T07:00Z", "2026-03-31T07:00Z"],
    ),
    # New York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00-05:00",
        ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00-04:00",
        ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"],
    ),
    (  # billing on the 1st at midnight New York time
        "0 0 1 * *",
        "America/New_York",
        "2026-10-15T00:00-04:00",
        ["2026-11-01T04:00Z", "2026-12-01T05:00Z", "2027-01-01T05:00Z"],
    ),
    # Lord Howe, a 30-minute shift: 2026-10-04 02:00 -> 02:30 (+11:00); 2026-04-05 02:00 ->
    # 01:30 (+10:30).
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00+10:30",
        ["2026-10-02T15:45Z", "2026-10-03T15:30Z", "2026-10-04T15:15Z"],
    ),
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00+11:00",
        ["2026-04-03T14:45Z", "2026-04-04T14:45Z", "2026-04-05T15:15Z"],
    ),
    # Kathmandu, +05:45 all year: local minutes 00/20/40 are UTC minutes 15/35/55.
    (
        "*/20 9 * * *",
        "Asia/Kathmandu",
        "2026-03-29T00:00+05:45",
        ["2026-03-29T03:15Z", "2026-03-29T03:35Z", "2026-03-29T03:55Z", "2026-03-30T03:15Z"],
    ),
    # Tokyo, no DST: the same UTC instant through everyone else's changes.
    (
        "0 9 * * *",
        "Asia/Tokyo",
        "2026-10-24T00:00+09:00",
        ["2026-10-24T00:00Z", "2026-10-25T00:00Z", "2026-10-26T00:00Z"],
    ),
    (
        "@monthly",
        "UTC",
        "2026-01-15T00:00Z",
        ["2026-02-01T00:00Z", "2026-03-01T00:00Z", "2026-04-01T00:00Z"],
    ),
]


@pytest.mark.parametrize(("expression", "zone", "start", "expected"), CASES)
def test_occurrences_across_a_years_clock_changes(
    expression: str, zone: str, start: str, expected: list[str]
) -> None:
    assert occurrences(expression, zone, start, len(expected)) == expected


def test_the_fall_back_hour_fires_each_local_time_once_and_latest_by_agrees() -> None:
    paris = cron("*/30 * * * *", "Europe/Paris", "2026-10-24T00:00Z")
    # 02:00 and 02:30 CET (01:00Z, 01:30Z) repeat 02:00 and 02:30 CEST: no occurrence then.
    assert paris.latest_by(ms("2026-10-25T01:59:59.999Z")) == ms("2026-10-25T00:30Z")
    assert paris.latest_by(ms("2026-10-25T02:00Z")) == ms("2026-10-25T02:00Z")
    assert paris.after(ms("2026-10-25T00:30Z")) == ms("2026-10-25T02:00Z")


def test_an_interval_is_absolute_time_whatever_the_zones_clocks_do() -> None:
    start = ms("2026-03-29T00:55Z")  # five minutes before Paris springs forward
    every = Recurrence.of(cron=None, every_ms=300_000, zone="Europe/Paris", start_ms=start)
    assert every.first() == start
    assert every.upcoming(start, 3) == [start + 300_000, start + 600_000, start + 900_000]
    assert every.after(start + 1) == start + 300_000
    assert every.latest_by(start + 899_999) == start + 600_000
    assert every.latest_by(start - 1) is None


def test_until_ends_a_schedule() -> None:
    start = ms("2026-01-01T00:00Z")
    ten = Recurrence.of(
        cron=None, every_ms=60_000, zone=None, start_ms=start, until_ms=start + 120_000
    )
    assert ten.upcoming(start - 1, 5) == [start, start + 60_000, start + 120_000]
    assert ten.after(start + 120_000) is None
    assert ten.latest_by(start + 10**9) == start + 120_000


def every_minute(missed: str, start: int) -> Recurrence:
    return Recurrence.of(cron=None, every_ms=60_000, zone=None, start_ms=start, missed=missed)


def test_an_occurrence_on_time_is_delivered_whatever_the_policy() -> None:
    start = ms("2026-06-01T09:00Z")
    for policy in Missed:
        assert every_minute(policy, start).fire(start, start + 30_000) == Fire(
            start, 0, start + 60_000
        )


def test_missed_occurrences_after_an_outage() -> None:
    start = ms("2026-06-01T09:00Z")
    ten = start + 600_000
    # Ten minutes down, back 5 s after 09:10: eleven occurrences due, 09:00 .. 09:10.
    back = ten + 5_000
    assert every_minute("latest", start).fire(start, back) == Fire(ten, 10, ten + 60_000)
    assert every_minute("all", start).fire(start, back) == Fire(start, 0, start + 60_000)
    assert every_minute("skip", start).fire(start, back) == Fire(ten, 10, ten + 60_000)
    # Every five minutes, down from 09:00 to 09:12:30: 09:00, 09:05 and 09:10 are due, and the
    # latest is missed too (150 s late): latest delivers it all the same, skip does not.
    five = Recurrence.of(cron=None, every_ms=300_000, zone=None, start_ms=start, missed="latest")
    back = start + 750_000
    assert five.fire(start, back) == Fire(start + 600_000, 2, start + 900_000)
    five = Recurrence.of(cron=None, every_ms=300_000, zone=None, start_ms=start, missed="skip")
    assert five.fire(start, back) == Fire(None, 3, start + 900_000)
    # A threshold of its own (delay-max-lateness): 10 s.
    strict = Recurrence.of(
        cron=None, every_ms=60_000, zone=None, start_ms=start, missed="skip", missed_after_ms=10_000
    )
    assert strict.fire(start, start + 11_000) == Fire(None, 1, start + 60_000)
    # A cron schedule counts what it passed over by walking its occurrences.
    daily = cron("0 9 * * *", "Europe/Paris", "2026-06-01T00:00+02:00")
    first = ms("2026-06-01T09:00+02:00")
    assert daily.fire(first, ms("2026-06-04T09:00:30+02:00")) == Fire(
        ms("2026-06-04T09:00+02:00"), 3, ms("2026-06-05T09:00+02:00")
    )


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"cron": None, "every_ms": None}, "exactly one of delay-cron and delay-every"),
        ({"cron": "* * * * *", "every_ms": 60_000}, "exactly one of delay-cron and delay-every"),
        ({"cron": "61 * * * *"}, "delay-cron: '61 * * * *': Bad minute"),
        ({"cron": "* * * *"}, "delay-cron: '* * * *': Wrong number of fields"),
        ({"cron": "@reboot"}, "delay-cron: '@reboot'"),
        ({"cron": "0 0 30 2 *"}, "delay-cron: '0 0 30 2 *': Bad day-of-month"),
        ({"cron": "0 0 * * *", "zone": "Mars/Olympus"}, "delay-timezone: 'Mars/Olympus' is no"),
        ({"cron": "0 0 * * *", "zone": "../etc/passwd"}, "delay-timezone: '../etc/passwd' is no"),
        ({"every_ms": 999}, "delay-every: 999 ms is shorter than a second"),
        ({"cron": "0 0 * * *", "missed": "sometimes"}, "delay-missed: 'sometimes' is none of"),
        ({"cron": "0 0 2 1 *", "until_ms": 1_000}, "no occurrence falls between its start"),
    ],
)
def test_what_cannot_be_a_schedule_is_refused_saying_why(
    fields: dict[str, object], detail: str
) -> None:
    given_fields: dict[str, object] = {"cron": None, "every_ms": None, "zone": None}
    given_fields.update(fields)
    for _ in range(2):  # the second time, a cron expression's verdict is the one kept
        with pytest.raises(BadSchedule) as refused:
            Recurrence.of(start_ms=0, **given_fields)  # type: ignore[arg-type]
        assert str(refused.value).startswith(detail), str(refused.value)


def test_macros_and_spacing_read_as_crontab_reads_them() -> None:
    start = "2026-05-05T10:17Z"
    for macro, fields in MACROS.items():
        assert occurrences(macro, "UTC", start, 3) == occurrences(fields, "UTC", start, 3)
    assert occurrences("@Daily", "UTC", start, 1) == ["2026-05-06T00:00Z"]
    assert occurrences(" 0  9\t* * MON-FRI ", "UTC", start, 1) == ["2026-05-06T09:00Z"]


ZONES = st.sampled_from(
    [
        "UTC",
        "Europe/Paris",
        "America/New_York",
        "Australia/Lord_Howe",
        "Asia/Kathmandu",
        "America/Santiago",
        "Pacific/Chatham",
    ]
)
EXPRESSIONS = st.sampled_from(
    [
        "* * * * *",
        "*/7 * * * *",
        "30 2 * * *",
        "0,15,30,45 1-3 * * *",
        "0 0 1 * *",
        "0 9 * * 1-5",
        "59 23 31 12 *",
        "0 0 29 2 *",
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    expression=EXPRESSIONS,
    zone=ZONES,
    start=st.integers(ms("2025-01-01T00:00Z"), ms("2030-01-01T00:00Z")),
)
# A start in the hour a fall-back repeats (02:00:00.001 CET, after 02:30 CEST): the walk from it
# gave 02:30 CEST, before the start, as the next occurrence, again and again.
@example(expression="30 2 * * *", zone="Europe/Paris", start=ms("2027-10-31T01:00Z") + 1)
def test_occurrences_rise_never_repeat_a_local_time_and_latest_by_finds_them(
    expression: str, zone: str, start: int
) -> None:
    schedule = Recurrence.of(cron=expression, every_ms=None, zone=zone, start_ms=start)
    found = schedule.upcoming(start - 1, 6)
    assert found and found[0] >= start
    assert found == sorted(set(found))  # rising, no instant twice
    walls = [schedule.local(t).replace(tzinfo=None) for t in found]
    assert len(set(walls)) == len(walls)  # a repeated local time fires once
    for t in found:
        assert t % 60_000 == 0  # whole minutes
        assert schedule.latest_by(t) == t
        assert schedule.after(t - 1) == t
    for earlier, later in itertools.pairwise(found):
        assert schedule.latest_by(later - 1) == earlier
        # upcoming continued one CronSim walk; a walk started afresh at each finds the same
        assert dataclasses.replace(schedule).after(earlier) == later
