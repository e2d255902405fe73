"""Header values as the contract writes them: durations, due times, topic names."""

from __future__ import annotations

import functools
import math
import re
import time
from datetime import UTC, datetime, timedelta, timezone

# Digits are ASCII only, and bounded: `str.isdigit()` alone is true for "²" and "٣", and `int()`
# refuses 4,301 digits; producer text never reaches `int()` but through _ascii_digits (and a
# length check, or _saturated).
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
# Canonical only (no leading zero): an id names one offset in one spelling.
_ORIGIN = re.compile(r"([a-zA-Z0-9._-]{1,249}):(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,18})")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
# A duration's digits past 19 count as this many: longer than any limit, never parsed whole.
_BEYOND = 10**19
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
# The due times the contract accepts: from 2000-01-01 (before it, epoch seconds taken for
# milliseconds, 1.7e9 s being 1970 in ms, or a zero time) up to the end of the year 9999 (past it,
# a unit mistake: µs or ns). The store's lanes are proven for this range (bridge.store.keys).
MIN_EPOCH_MS = 946_684_800_000
MAX_EPOCH_MS = 253_402_300_799_999


def wall_ms() -> int:
    """This host's wall clock, epoch ms."""
    return time.time_ns() // 1_000_000


def parse_count(text: str | bytes | None, limit: int = MAX_INT64) -> int | None:
    """ASCII decimal digits (1 to 19 of them, surrounding blanks allowed) as a number no larger
    than ``limit``; None for anything else (a sign, another script's digits, too many)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    if text is None:
        return None
    text = text.strip()
    if not _ascii_digits(text) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= limit else None


def _ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more of 0-9 and nothing else: what ``[0-9]+`` matches, read per
    record without a regular expression (an ASCII character is a digit only if it is one of
    them)."""
    return text.isascii() and text.isdigit()


def parse_origin(text: str) -> tuple[str, int, int] | None:
    """``<topic>:<partition>:<offset>`` (a default delay-id, a ``delay-origin``) as its three
    parts; None when ``text`` is not one: a legal topic name, a partition and an offset in
    ASCII digits, within Kafka's ranges."""
    match = _ORIGIN.fullmatch(text)
    if match is None or match.group(1) in (".", ".."):
        return None
    partition, offset = int(match.group(2)), int(match.group(3))
    if partition > MAX_INT32 or offset > MAX_INT64:
        return None
    return match.group(1), partition, offset


@functools.lru_cache(maxsize=1024)
def parse_duration_ms(text: str) -> int:
    """``"1500"`` → 1500; ``"250ms"``, ``"30s"``, ``"15m"``, ``"2h"``, ``"7d"``, ``"1h30m"`` → ms.

    Raises ValueError for anything else (negative, empty, unknown unit, repeated unit order).
    Cached: producers use a handful of delays, and this runs per record.
    """
    text = text.strip()
    if _ascii_digits(text):
        return _saturated(text)
    pos = total = 0
    last_rank = -1
    ranks = ["d", "h", "m", "s", "ms"]
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ValueError(f"not a duration: {text!r} (use e.g. 250ms, 30s, 15m, 2h, 7d, 1h30m)")
        rank = ranks.index(match.group(2))
        if rank <= last_rank:
            raise ValueError(f"not a duration: {text!r} (units must go from largest to smallest)")
        last_rank = rank
        total += _saturated(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError("empty duration")
    return total


def _saturated(digits: str) -> int:
    """ASCII digits as a number, or :data:`_BEYOND` when they are more than 19."""
    return int(digits) if len(digits) <= 19 else _BEYOND


def format_duration_ms(ms: int) -> str:
    """The shortest duration string that :func:`parse_duration_ms` reads back as ``ms``."""
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNIT_MS[unit]
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)


def parse_when(text: str, now_ms: int, *, ago: bool = False) -> int:
    """A moment as the command line takes it: epoch ms or RFC 3339 (:func:`parse_time_ms`), or a
    duration counted from ``now_ms`` — ahead (``1h``: an hour from now; ``-1h``: an hour ago),
    or back when ``ago`` (``7d``: a week ago, as a ``--since`` reads). ValueError otherwise."""
    try:
        return parse_time_ms(text)
    except ValueError:
        if _ascii_digits(text.strip()):  # epoch ms: parse_time_ms says what is wrong
            raise
    stripped, sign = text.strip(), -1 if ago else 1
    if stripped[:1] in ("-", "+"):
        sign, stripped = (-sign if stripped[0] == "-" else sign), stripped[1:]
    try:
        return now_ms + sign * parse_duration_ms(stripped)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (epoch milliseconds, RFC 3339 such as 2026-11-21T10:00:00Z, "
            f"or a duration {'back' if ago else 'ahead'} from now such as {'7d' if ago else '1h'})"
        ) from None


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds (digits) or RFC 3339 with an offset → epoch ms.

    Fractions below a millisecond round up, so a record is never due before the time it names.
    A time before 2000-01-01 is refused however it is written: as epoch milliseconds it is almost
    always epoch seconds, as RFC 3339 a zero value (Go's ``time.Time{}`` is year 1); and no due
    time outside 2000-9999 reaches the store, whose arithmetic is proven for that range only.
    """
    text = text.strip()
    if _ascii_digits(text):
        if len(text) > 19 or (value := int(text)) > MAX_EPOCH_MS:
            raise ValueError(f"epoch milliseconds out of range: {len(text)} digits")
        if value < MIN_EPOCH_MS:
            raise ValueError(
                f"{text} as epoch milliseconds is before 2000-01-01 ({format_time_ms(value)}); "
                f"it looks like epoch seconds: give milliseconds ({text}000)"
            )
        return value
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(
            f"not a time: {text!r} (use epoch milliseconds or RFC 3339, e.g. 2026-11-21T10:00:00Z)"
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, offset = match.group(7) or "", match.group(8)
    if offset in ("Z", "z"):
        tz = UTC
    else:
        sign = 1 if offset[0] == "+" else -1
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(f"bad UTC offset in {text!r}")
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        # RFC 3339 allows a leap second (:60); it is the same instant as :59 + 1 s.
        leap = second == 60
        moment = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=tz)
    except ValueError as exc:
        raise ValueError(f"not a time: {text!r} ({exc})") from None
    whole_ms = int(moment.timestamp()) * 1000 + (1000 if leap else 0)
    frac_ms = math.ceil(int(fraction) * 1000 / 10 ** len(fraction)) if fraction else 0
    value = whole_ms + frac_ms
    if value < MIN_EPOCH_MS:
        raise ValueError(f"{text} is before 2000-01-01: a zero or default time, not a due time")
    if value > MAX_EPOCH_MS:
        raise ValueError(f"{text} is after the year 9999")
    return value


def cut(text: str, limit: int = 80) -> str:
    """``text`` for a table cell, a page or a log line: at most ``limit`` characters, the last an
    ellipsis when it was longer (the full value stays in ``--json`` and the API)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def format_time_ms(ms: int) -> str:
    """Epoch ms → RFC 3339 UTC with milliseconds (plain ms outside the years 1 to 9999)."""
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms after the epoch"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def is_legal_topic(name: str) -> bool:
    """Kafka's own rule for topic names."""
    return name not in (".", "..") and _LEGAL_TOPIC.fullmatch(name) is not None


def topic_refusal(name: str) -> str | None:
    """Why no record may ever be delivered to ``name`` whatever the config (not a legal name,
    or internal), or None; :meth:`Rules.target_refusal` adds what the config rules out."""
    if not is_legal_topic(name):
        return f"{name!r} is not a legal topic name"
    if name.startswith("__"):
        return f"{name!r} is an internal topic"
    return None
