"""Properties of the header parser over the edges of every range: each input is stored, cancelled
or dead-lettered with the right reason, and nothing else (no other exception, no due time outside
the range the store's arithmetic is proven for)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.message import (
    CONTROL_HEADERS,
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_ID,
    H_PAUSE,
    H_PRIORITY,
    H_RESUME,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    MAX_EPOCH_MS,
    MAX_ID_BYTES,
    MIN_EPOCH_MS,
    SCHEDULING,
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    decode,
    encode,
    origin,
    parse,
    parse_count,
    parse_duration_ms,
    parse_origin,
    parse_time_ms,
    record_size,
)
from bridge.store import Shard, default_id_offset
from bridge.store.across import due_hint

NOW = 1_790_000_000_000
LIMIT = 2000
RULES = Rules(
    delay_topics=frozenset({"delay"}),
    default_targets={},
    allowed_targets=(re.compile(r"orders.*"),),
    dead_letter="delay.dlq",
    max_delay_ms=parse_duration_ms("365d"),
    max_record_bytes=LIMIT,
)


def outcome(
    headers: Headers,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    timestamp_ms: int | None = NOW,
) -> Scheduled | Cancel | Reason:
    try:
        return parse(
            RULES,
            topic="delay",
            partition=0,
            offset=7,
            timestamp_ms=timestamp_ms,
            key=key,
            value=value,
            headers=headers,
            now_ms=NOW,
        )
    except Rejected as exc:
        assert exc.detail and "\n" not in exc.detail
        return exc.reason


def rfc3339(moment: datetime, fraction: str) -> bytes:
    return (moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z").encode()


@settings(max_examples=400)
@given(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.sampled_from(["", ".0", ".5", ".000001", ".999999999"]),
)
@example(datetime(1999, 12, 31, 23, 59, 59), ".999999999")  # rounds up to 2000: accepted
def test_a_due_time_from_year_1_to_9999_is_accepted_only_from_2000(
    moment: datetime, fraction: str
) -> None:
    moment = moment.replace(microsecond=0)
    got = outcome([(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, rfc3339(moment, fraction))])
    ms = int(moment.replace(tzinfo=UTC).timestamp() * 1000)
    # A part below a millisecond rounds up: 1999-12-31T23:59:59.999999999Z is due at 2000.
    due = ms + math.ceil(Decimal(f"0{fraction}") * 1000)
    if due < MIN_EPOCH_MS:
        assert got is Reason.BAD_DUE_TIME
    elif due - NOW > RULES.max_delay_ms:
        assert got is Reason.DELAY_TOO_LONG
    else:
        assert isinstance(got, Scheduled) and ms <= got.due_ms <= ms + 1000


@settings(max_examples=300)
@given(
    st.one_of(
        st.integers(0, 10**20),
        st.sampled_from([MIN_EPOCH_MS - 1, MIN_EPOCH_MS, MAX_EPOCH_MS, MAX_EPOCH_MS + 1]),
    )
)
def test_epoch_milliseconds_anywhere(ms: int) -> None:
    got = outcome([(H_TARGET_TOPIC, b"orders"), (H_DELIVER_AT, str(ms).encode())])
    if not MIN_EPOCH_MS <= ms <= MAX_EPOCH_MS:
        assert got is Reason.BAD_DUE_TIME
    elif ms - NOW > RULES.max_delay_ms:
        assert got is Reason.DELAY_TOO_LONG
    else:
        assert isinstance(got, Scheduled) and got.due_ms == ms


@given(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.integers(0, 10**16))
def test_a_relative_delay_from_any_record_timestamp(timestamp: int | None, after: int) -> None:
    got = outcome(
        [(H_TARGET_TOPIC, b"orders"), (H_AFTER, str(after).encode())], timestamp_ms=timestamp
    )
    base = timestamp if timestamp is not None and timestamp >= 0 else NOW
    if base + after - NOW > RULES.max_delay_ms:
        assert got is Reason.DELAY_TOO_LONG
    elif base + after < MIN_EPOCH_MS:
        assert got is Reason.BAD_DUE_TIME
    else:
        assert isinstance(got, Scheduled) and got.due_ms == base + after


@given(st.integers(-3, 3), st.sampled_from(["key", "value", "header"]))
def test_every_size_around_the_limit(delta: int, where: str) -> None:
    headers: Headers = [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")]
    room = LIMIT - record_size(b"k", b"v", headers) + delta
    key, value = b"k", b"v"
    if where == "key":
        key += b"x" * room
    elif where == "value":
        value += b"x" * room
    else:
        headers.append(("pad", b"x" * (room - 3)))
    got = outcome(headers, key=key, value=value)
    assert (got is Reason.TOO_LARGE) == (delta > 0)


@given(st.sampled_from(sorted(CONTROL_HEADERS)))
def test_every_control_header_twice_is_a_bad_header(name: str) -> None:
    value = {
        H_TARGET_TOPIC: b"orders",
        H_AFTER: b"1s",
        H_DELIVER_AT: b"1790000000000",
        H_PRIORITY: b"high",
        H_CANCEL: b"x",
        H_ID: b"x",
    }.get(name, b"x")
    assert outcome([(H_TARGET_TOPIC, b"orders"), (name, value), (name, value)]) in (
        Reason.BAD_HEADER,
    )


@given(
    st.sampled_from(sorted(CONTROL_HEADERS - {H_TARGET_KEY} - SCHEDULING)),
    st.binary(min_size=1, max_size=8),
)
def test_a_control_header_that_is_not_utf8_is_a_bad_header(name: str, tail: bytes) -> None:
    headers: Headers = [(name, b"\xff" + tail)]
    if name != H_TARGET_TOPIC:
        headers.append((H_TARGET_TOPIC, b"orders"))
    got = outcome(headers)
    assert got is Reason.BAD_HEADER


@given(st.sampled_from(sorted(SCHEDULING)), st.binary(max_size=12), st.booleans())
def test_a_recurring_schedules_header_is_a_bad_schedule_whatever_its_value(
    name: str, value: bytes, one_shot: bool
) -> None:
    """Refused whatever else the record says — never delivered once as a one-shot record — but
    a pause or a resume alone, naming a schedule by a delay-id it could have."""
    headers: Headers = [(name, value)]
    if one_shot:
        headers += [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")]
    got = outcome(headers)
    if name in (H_PAUSE, H_RESUME) and not one_shot and value and _utf8(value):
        assert isinstance(got, Cancel) and got.hold is (name == H_PAUSE)
        assert got.delay_id == value.decode()
    else:
        assert got is Reason.BAD_SCHEDULE


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@given(st.integers(0, MAX_ID_BYTES + 2), st.sampled_from([H_ID, H_CANCEL]))
def test_ids_of_every_length(length: int, name: str) -> None:
    headers: Headers = [(name, b"i" * length)]
    if name == H_ID:
        headers += [(H_TARGET_TOPIC, b"orders"), (H_AFTER, b"1s")]
    got = outcome(headers)
    if not 1 <= length <= MAX_ID_BYTES:
        assert got is Reason.BAD_HEADER
    elif name == H_ID:
        assert isinstance(got, Scheduled) and got.delay_id == "i" * length
    else:
        assert got == Cancel(7, "i" * length)


_HEADER_NAMES = st.sampled_from([*sorted(CONTROL_HEADERS), "trace", "delay-other"])
_HEADER_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.sampled_from(
        [
            b"orders",
            b"orders.eu",
            b"__consumer_offsets",
            b"delay",
            b"delay.dlq",
            b"1s",
            b"0",
            b"-1",
            b"1h30m",
            b"1790000000000",
            b"1790000000",
            b"2026-11-21T10:00:00Z",
            b"0001-01-01T00:00:00Z",
            b"1969-12-31T23:59:59Z",
            b"9999-12-31T23:59:59.999999999Z",
            b"high",
            b"normal",
            b"low",
            b"urgent",
        ]
    ),
)


@settings(max_examples=500)
@given(st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=6))
def test_any_headers_are_stored_cancelled_or_dead_lettered(headers: Headers) -> None:
    got = outcome(headers)
    if isinstance(got, Scheduled):
        # What the parser stores, the store can hold: the stored encoding gives it back.
        assert decode(encode(got, "delay", 0), "delay", 0, got.offset) == got
        assert MIN_EPOCH_MS <= got.due_ms <= MAX_EPOCH_MS
        assert got.due_ms - NOW <= RULES.max_delay_ms
        assert RULES.target_refusal(got.target) is None
    elif isinstance(got, Cancel):
        assert 1 <= len(got.delay_id.encode()) <= MAX_ID_BYTES
    else:
        assert isinstance(got, Reason)


# Text from every Unicode category (digits of every script among them: "²" and "٣" are
# str.isdigit()), numbers past every limit, and default ids of every partition with such tails.
_ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=24)
_NUMBERS = st.integers(min_value=-(10**30), max_value=10**30).map(str)
_HOSTILE_VALUES = st.one_of(
    _ANY_TEXT.map(str.encode),
    _NUMBERS.map(str.encode),
    st.builds(
        lambda p, tail: f"delay:{p}:{tail}".encode(),
        st.integers(-2, 2**32),
        st.one_of(_ANY_TEXT, _NUMBERS, st.just("9" * 5000)),
    ),
    st.just(b"9" * 5000),
)


@settings(max_examples=500)
@given(st.lists(st.tuples(_HEADER_NAMES | st.just("delay-due-at"), _HOSTILE_VALUES), max_size=5))
def test_values_from_the_whole_space_reach_no_stage_unparsed(headers: Headers) -> None:
    """What the parser lets through, every stage after it takes without raising: the default-id
    lookup, the replacement's due-time hint, a cancel's hint. A cancel of ``delay:0:²`` stalled
    the ingress: ``str.isdigit`` said yes, ``int`` refused."""
    got = outcome(headers)
    shard = Shard("delay", 0)
    if isinstance(got, Scheduled | Cancel):
        named = default_id_offset(shard, got.delay_id)
        assert named is None or (0 <= named < 2**63 and got.delay_id == f"delay:0:{named}")
    if isinstance(got, Scheduled):
        hint = due_hint(got.headers)
        assert hint is None or 0 <= hint < 2**63
    if isinstance(got, Cancel):
        for each in got.each():
            assert each.due_ms is None or 0 <= each.due_ms < 2**63


@given(st.one_of(_ANY_TEXT, _NUMBERS, st.from_regex(r"[a-z.]{1,5}:[0-9]{1,12}:[0-9]{1,25}")))
def test_an_origin_reads_back_only_as_its_own_text(text: str) -> None:
    parts = parse_origin(text)
    assert parts is None or origin(*parts) == text
    count = parse_count(text)
    assert count is None or (count == int(text.strip()) and count < 2**63)


def test_a_number_is_ascii_digits_whatever_code_point_stands_in_it() -> None:
    """The checks read per record without a regular expression (``isascii`` and ``isdigit``)
    take exactly 0-9: every code point of Unicode tried alone and as a digit among ASCII ones."""
    for point in range(0x110000):
        char = chr(point)
        ascii_digit = "0" <= char <= "9"
        for text in (char, f"17{char}0000000000"):
            assert (parse_count(text) is not None) == ascii_digit, repr(text)
        try:
            parse_time_ms(f"1{char}00000000000")
        except ValueError:
            assert not ascii_digit, repr(char)
        else:
            assert ascii_digit, repr(char)


@given(st.one_of(_ANY_TEXT, _NUMBERS))
def test_a_count_is_what_the_pattern_of_one_to_19_ascii_digits_reads(text: str) -> None:
    stripped = text.strip()
    expected = int(stripped) if re.fullmatch(r"[0-9]{1,19}", stripped) else None
    assert parse_count(text) == (expected if expected is None or expected < 2**63 else None)
