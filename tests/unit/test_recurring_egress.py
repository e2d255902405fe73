"""A recurring schedule at the egress (bridge.egress.recurring): what each occurrence delivers, and
the record that carries the schedule on — read back by the ingress's own parser, step after step,
so the chain keeps the schedule's arithmetic across a zone's clock changes, its count and its end."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from bridge.egress.failures import InFlight
from bridge.egress.outlet import Both
from bridge.egress.recurring import Step, occurrence_headers, sending, step
from bridge.egress.settle import count_acknowledged
from bridge.health import Readiness
from bridge.message import (
    H_AFTER,
    H_CONTINUES,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_DUE_AT,
    H_EVERY,
    H_ID,
    H_MAX_LATENESS,
    H_MISSED,
    H_OCCURRENCE,
    H_TARGET_TOPIC,
    H_TIMEZONE,
    H_UNTIL,
    Headers,
    Priority,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    parse,
    parse_duration_ms,
    record_size,
)
from bridge.metrics import Metrics
from bridge.store import Claimed, Shard

RULES = Rules(
    delay_topics=frozenset({"delay"}),
    default_targets={},
    allowed_targets=(re.compile(".*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("400d"),
    max_record_bytes=100_000,
)


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def utc(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")


def read(
    headers: Headers, offset: int, now_ms: int, rules: Rules = RULES, value: bytes = b"v"
) -> Scheduled:
    """The record as the ingress stores it, produced at ``now_ms``."""
    got = parse(
        rules,
        topic="delay",
        partition=0,
        offset=offset,
        timestamp_ms=now_ms,
        key=b"k",
        value=value,
        headers=headers,
        now_ms=now_ms,
    )
    assert isinstance(got, Scheduled) and got.recurring
    return got


def chain(
    headers: Headers, produced_ms: int, steps: int, rules: Rules = RULES
) -> list[tuple[int | None, Headers]]:
    """Deliver a schedule ``steps`` times, each record at its due time, reading the record that
    carries it on as the ingress would: each step's occurrence and that record's headers."""
    return [
        (did.occurrence_ms, did.onward or []) for _, did in walk(headers, produced_ms, steps, rules)
    ]


def walk(
    headers: Headers, produced_ms: int, steps: int, rules: Rules = RULES
) -> list[tuple[Scheduled, Step]]:
    """:func:`chain`'s records, each with what it did at its due time."""
    record = read(headers, 0, produced_ms, rules)
    out: list[tuple[Scheduled, Step]] = []
    for n in range(1, steps + 1):
        did = step(record, record.due_ms)
        out.append((record, did))
        if did.onward is None:
            break
        record = read(did.onward, n, record.due_ms, rules)
    return out


def test_a_cron_schedule_carried_on_keeps_its_zones_clock_changes() -> None:
    """02:30 every day in Paris, through the night the clocks go forward (02:30 does not exist:
    it fires at 03:00 CEST) and the night they go back (02:30 happens twice: it fires once)."""
    spring: Headers = [(H_TARGET_TOPIC, b"out"), (H_CRON, b"30 2 * * *"), (H_ID, b"nightly")]
    spring += [(H_TIMEZONE, b"Europe/Paris")]
    got = [utc(o) for o, _ in chain(spring, ms("2026-03-27T12:00:00+00:00"), 4) if o is not None]
    assert got == [
        "2026-03-28T01:30Z",  # 02:30 CET
        "2026-03-29T01:00Z",  # 03:00 CEST: the first instant after the gap
        "2026-03-30T00:30Z",  # 02:30 CEST
        "2026-03-31T00:30Z",
    ]
    got = [utc(o) for o, _ in chain(spring, ms("2026-10-23T12:00:00+00:00"), 4) if o is not None]
    assert got == [
        "2026-10-24T00:30Z",  # 02:30 CEST
        "2026-10-25T00:30Z",  # 02:30 CEST, the first of the two: once
        "2026-10-26T01:30Z",  # 02:30 CET
        "2026-10-27T01:30Z",
    ]


RULES_30D = replace(RULES, max_delay_ms=parse_duration_ms("30d"))
DAY = 86_400_000


def test_a_leap_day_schedule_under_a_30_day_max_delay_waits_15_days_at_most_per_record() -> None:
    """Midnight UTC on 29 February, every fourth year, with limits.max_delay 30 days: each record
    of the schedule falls due at most 15 days after it was produced (the topic's retention, at
    least limits.max_delay, always holds it), delivers nothing until the occurrence, and then
    delivers it once, at its instant."""
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_CRON, b"0 0 29 2 *"), (H_ID, b"leap")]
    produced = ms("2027-03-01T00:00:00+00:00")
    steps = walk(headers, produced, 400, RULES_30D)
    at = produced
    for record, _ in steps:
        assert record.due_ms - at <= 15 * DAY
        at = record.due_ms
    delivered = [(r.due_ms, d.occurrence_ms) for r, d in steps if d.occurrence_ms is not None]
    got = [utc(o) for _, o in delivered]
    assert got[:3] == ["2028-02-29T00:00Z", "2032-02-29T00:00Z", "2036-02-29T00:00Z"]
    assert all(due == o for due, o in delivered)  # each at its instant, none early
    # Its start, the record's own timestamp, was written into the stored record as absolute.
    assert dict(steps[0][0].headers)[H_DELIVER_AT] == str(produced).encode()


def test_an_interval_whose_start_is_further_out_than_half_the_max_delay_keeps_its_grid() -> None:
    """Every 40 days from 20 days after the record (``delay-after``), with limits.max_delay 30
    days: the first record is due after 15 days, with nothing to deliver; its start was made
    absolute when it was read, so the occurrences stay on the grid the record gave."""
    produced = ms("2027-01-01T00:00:00+00:00")
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"40d"), (H_ID, b"grid")]
    headers += [(H_AFTER, b"20d"), (H_COUNT, b"3")]
    steps = walk(headers, produced, 50, RULES_30D)
    assert steps[0][0].due_ms == produced + 15 * DAY and steps[0][1].occurrence_ms is None
    assert [d.occurrence_ms for _, d in steps if d.occurrence_ms is not None] == [
        produced + (20 + 40 * k) * DAY for k in range(3)
    ]
    assert steps[-1][1].onward is None  # the count reached


def test_a_record_carried_on_between_occurrences_and_reached_late_follows_the_missed_policy() -> (
    None
):
    """The bridge got to a record carried on between two occurrences only after the second
    had passed (an outage): it delivers the latest, once, as any late occurrence would."""
    produced = ms("2027-01-01T00:00:00+00:00")
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"40d"), (H_ID, b"late")]
    headers += [(H_DELIVER_AT, str(produced + 40 * DAY).encode()), (H_CONTINUES, b"0")]
    record = read(headers, 1, produced, RULES_30D)
    assert record.due_ms == produced + 15 * DAY
    did = step(record, produced + 81 * DAY)
    assert did.occurrence_ms == produced + 80 * DAY
    assert dict(did.onward or [])[H_DELIVER_AT] == str(produced + 120 * DAY).encode()


def test_a_schedule_may_start_no_further_out_than_the_max_delay() -> None:
    """As a one-shot record may be due no further out; its first occurrence may be further out
    than that (a cron that fires once a year), reached in steps."""
    produced = ms("2027-01-02T00:00:00+00:00")
    far: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"1d"), (H_ID, b"far")]
    with pytest.raises(Rejected) as refused:
        read([*far, (H_AFTER, b"31d")], 0, produced, RULES_30D)
    assert refused.value.reason is Reason.DELAY_TOO_LONG
    assert "the schedule starts 2027-02-02" in refused.value.detail
    yearly: Headers = [(H_TARGET_TOPIC, b"out"), (H_CRON, b"0 0 1 1 *"), (H_ID, b"new-year")]
    assert read(yearly, 0, produced, RULES_30D).due_ms == produced + 15 * DAY


def test_an_interval_counts_down_and_ends() -> None:
    start = ms("2026-06-01T00:00:00+00:00")
    headers: Headers = [
        (H_TARGET_TOPIC, b"out"),
        (H_EVERY, b"90s"),
        (H_ID, b"poll"),
        (H_COUNT, b"3"),
    ]
    headers += [(H_DELIVER_AT, str(start).encode())]
    steps = chain(headers, start - 5000, 10)
    assert [o for o, _ in steps] == [start, start + 90_000, start + 180_000]
    assert steps[-1][1] == []  # the third ends it: nothing carries it on
    first = dict(steps[0][1])
    assert first[H_COUNT] == b"2" and first[H_CONTINUES] == b"0"
    assert first[H_DELIVER_AT] == str(start + 90_000).encode()


def test_the_record_carrying_a_schedule_on_keeps_what_it_says_and_resets_its_start() -> None:
    """Its own headers pass on (a producer's, the zone, the end); a relative start is replaced
    by the next occurrence, absolute, so it does not count from the new record's timestamp."""
    now = ms("2026-06-01T00:00:00+00:00")
    headers: Headers = [
        (H_TARGET_TOPIC, b"out"),
        (H_EVERY, b"1h"),
        (H_ID, b"poll"),
        (H_AFTER, b"10m"),
        (H_UNTIL, str(now + 3 * 3_600_000).encode()),
        ("trace", b"abc"),
    ]
    did = step(read(headers, 7, now), now + 600_000)
    assert did.occurrence_ms == now + 600_000
    assert did.onward is not None
    names = [k for k, _ in did.onward]
    assert H_AFTER not in names and names.count(H_DELIVER_AT) == 1
    assert dict(did.onward)[H_DELIVER_AT] == str(now + 600_000 + 3_600_000).encode()
    assert dict(did.onward)[H_CONTINUES] == b"7" and dict(did.onward)["trace"] == b"abc"
    last = read(did.onward, 8, now + 600_000)
    assert step(last, last.due_ms).onward is not None
    after = step(
        read(step(last, last.due_ms).onward or [], 9, last.due_ms), last.due_ms + 3_600_000
    )
    assert after.onward is None  # the next would be past delay-until


def test_missed_occurrences_at_the_egress() -> None:
    """Come to 11.5 minutes late with a max lateness of 10 s (so the latest is missed too): ``latest`` delivers the latest
    occurrence due by then; ``skip`` delivers none and carries the schedule on; a skipped last
    occurrence ends it with nothing produced."""
    start = ms("2026-06-01T00:00:00+00:00")
    base: Headers = [
        (H_TARGET_TOPIC, b"out"),
        (H_EVERY, b"1m"),
        (H_ID, b"p"),
        (H_MAX_LATENESS, b"10s"),
    ]
    base += [(H_DELIVER_AT, str(start).encode())]
    late = start + 10 * 60_000 + 90_000
    latest = step(read(base, 0, start), late)
    assert latest.occurrence_ms == start + 11 * 60_000
    assert dict(latest.onward or [])[H_DELIVER_AT] == str(start + 12 * 60_000).encode()
    skip = step(read([*base, (H_MISSED, b"skip")], 0, start), late)
    assert skip.occurrence_ms is None and skip.onward is not None
    ending: Headers = [*base, (H_MISSED, b"skip"), (H_UNTIL, str(start + 30_000).encode())]
    assert step(read(ending, 0, start), late) == type(skip)(None, None)


def test_an_occurrence_carries_the_schedules_id_and_instant_and_no_control_header() -> None:
    now = ms("2026-06-01T00:00:00+00:00")
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"1m"), (H_ID, b"p"), ("mine", b"1")]
    record = read([*headers, (H_DELIVER_AT, str(now).encode())], 3, now)
    got = occurrence_headers(record, now)
    assert got == [
        ("mine", b"1"),
        (H_ID, b"p"),
        (H_DUE_AT, str(now).encode()),
        (H_OCCURRENCE, str(now).encode()),
    ]


def test_two_reports_are_told_as_one() -> None:
    """Both records in: the first's message when both went, the first error when one did not."""
    told: list[tuple[object, object]] = []
    both = Both(lambda err, msg: told.append((err, msg)))
    both.second(None, None)
    assert told == []
    both.first(None, "occurrence")  # type: ignore[arg-type]
    assert told == [(None, "occurrence")]
    failed = KafkaError(KafkaError._MSG_TIMED_OUT)
    told.clear()
    both = Both(lambda err, msg: told.append((err, msg)))
    both.first(None, "occurrence")  # type: ignore[arg-type]
    both.second(failed, None)
    assert told == [(failed, None)]


def test_an_occurrence_counts_as_delivered_late_from_its_own_instant() -> None:
    """``latest`` delivers the latest occurrence due when the bridge came to the record: its
    lateness counts from that instant, not from the record's due time; a step that delivers
    nothing (skipped, or carried on between occurrences) is no delivery."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    start = ms("2026-06-01T00:00:00+00:00")
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"1m"), (H_ID, b"p")]
    record = read([*headers, (H_DELIVER_AT, str(start).encode())], 0, start)
    late = start + 10 * 60_000 + 1500  # the 10th occurrence after it, 1.5 s late
    delivered = InFlight(Claimed(Shard("delay", 0), b"m", record, False))
    sending(record, Shard("delay", 0), late, delivered)
    assert delivered.occurrence_ms == start + 10 * 60_000
    skipped_record = read(
        [
            *headers,
            (H_DELIVER_AT, str(start).encode()),
            (H_MISSED, b"skip"),
            (H_MAX_LATENESS, b"1s"),
        ],
        1,
        start,
    )
    skipped = InFlight(Claimed(Shard("delay", 0), b"n", skipped_record, False))
    sending(skipped_record, Shard("delay", 0), late + 60_000, skipped)
    assert skipped.occurrence_ms is None
    count_acknowledged(metrics, Readiness(), [(delivered, late), (skipped, late + 60_000)])
    assert registry.get_sample_value("delay_bridge_delivered_total", {"target_topic": "out"}) == 1
    total = registry.get_sample_value(
        "delay_bridge_delivery_lateness_seconds_sum", {"priority": Priority.NORMAL.label}
    )
    assert total == 1.5


def test_a_schedule_at_the_size_limit_is_carried_on_all_the_same() -> None:
    """A schedule's record exactly ``limits.max_record_bytes`` long, with a relative start: the
    record carrying it on adds its absolute start, its count and the offset it continues (and
    may be paused), and is stored all the same — a few bytes over the limit cost no schedule."""
    rules = replace(RULES, max_record_bytes=400)
    now = ms("2026-06-01T00:00:00+00:00")
    headers: Headers = [(H_TARGET_TOPIC, b"out"), (H_EVERY, b"1m"), (H_ID, b"p")]
    headers += [(H_AFTER, b"0"), (H_COUNT, b"9")]
    fill = 400 - record_size(b"k", b"", headers)
    record = parse(
        rules,
        topic="delay",
        partition=0,
        offset=123_456_789_012,
        timestamp_ms=now,
        key=b"k",
        value=b"v" * fill,
        headers=headers,
        now_ms=now,
    )
    assert isinstance(record, Scheduled)
    did = step(record, now, paused=True)
    onward = did.onward or []
    assert record_size(b"k", record.value, onward) > 400
    carried = read(onward, 123_456_789_013, now, rules, record.value or b"")
    assert carried.continues == 123_456_789_012
    with pytest.raises(Rejected) as refused:  # a producer's own is held to the limit
        read([*headers, ("x", b"y")], 0, now, rules, record.value or b"")
    assert refused.value.reason is Reason.TOO_LARGE
