"""When a recurring schedule's occurrences fall, and which to deliver after an outage (pure).

A recurring schedule (the contract's "Recurring schedules"; not delivered yet) is one record with
``delay-cron`` — five fields read in ``delay-timezone`` (an IANA name, UTC by default), or a macro
``@hourly`` … ``@yearly`` — or ``delay-every`` (a duration of at least a second: occurrences at the
start plus whole intervals, in absolute time, whatever the zone's clocks do). :class:`Recurrence`
is its arithmetic; the store and the egress keep where it has got to.

Cron fields are read as crontab(5) reads them, by cronsim (Debian cron's semantics, including
day-of-month *or* day-of-week when both are restricted), with the contract's two rules for a
zone's clock changes, tested per zone in tests/unit/test_recurring.py:

- a local time that does not exist (spring forward) fires at the first instant after the gap
  (02:30 on the night Paris goes from 02:00 to 03:00 fires at 03:00 CEST);
- a local time that occurs twice (fall back) fires once, at its first occurrence (``*/30 * * * *``
  fires at 02:00 and 02:30 CEST, not again at 02:00 and 02:30 CET).

Occurrences that fell due while nothing could deliver them (an outage, the bridge stopped) are
*missed*: later than ``missed_after_ms`` (the schedule's ``delay-max-lateness``, else a minute, as
Quartz's misfire threshold) when the bridge gets to them. ``delay-missed`` says what becomes of
them (:meth:`Recurrence.fire`): ``latest`` (default) delivers the latest occurrence due by then,
once; ``all`` delivers every one, in order; ``skip`` delivers the latest only if it is not missed
itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from bridge.message.headers import (
    H_AFTER,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_MISSED,
    H_TIMEZONE,
    H_UNTIL,
    MAX_ID_BYTES,
)
from bridge.message.values import parse_count, parse_duration_ms, parse_time_ms

MIN_EVERY_MS = 1_000
MISSED_AFTER_MS = 60_000  # an occurrence this late is missed, unless delay-max-lateness says
# Steps a search of cron occurrences takes at most: a minute-by-minute expression over a long
# outage is walked backwards from now, not forwards from the outage's start.
MAX_STEPS = 10_000
MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_SPACES = re.compile(r"\s+")


class Missed(StrEnum):
    """What becomes of occurrences missed (``delay-missed``)."""

    LATEST = "latest"
    ALL = "all"
    SKIP = "skip"


class BadSchedule(ValueError):
    """A schedule that cannot be: the detail of a ``bad-schedule`` dead letter."""


@dataclass(frozen=True)
class Fire:
    """What to do with an occurrence the bridge got to at some moment: deliver ``deliver`` (None:
    nothing: it was missed and ``skip`` drops it), having passed over ``skipped`` occurrences,
    and come back at ``next_ms`` (None: the schedule has ended)."""

    deliver: int | None
    skipped: int
    next_ms: int | None


_UNKNOWN = object()


class _Walk:
    """What a cron :class:`Recurrence` keeps of its CronSim walks: its first occurrence once
    found (``_UNKNOWN`` until then), and the walk under way — the occurrence it last gave and its
    iterator, which the occurrence after that one continues instead of parsing and walking from
    the start again (an egress step asks for its first occurrence, then for the one after)."""

    __slots__ = ("at", "first", "times")

    def __init__(self) -> None:
        self.first: object = _UNKNOWN
        self.at = 0
        self.times: CronSim | None = None


@dataclass(frozen=True)
class Recurrence:
    """A schedule's occurrences: from ``start_ms`` (the first at or after it) to ``until_ms``
    (none after it; None: no end), every ``every_ms`` or as ``cron`` says in ``zone``."""

    cron: str = ""
    every_ms: int = 0
    zone: str = "UTC"
    start_ms: int = 0
    until_ms: int | None = None
    missed: Missed = Missed.LATEST
    missed_after_ms: int = MISSED_AFTER_MS
    count: int | None = None  # occurrences delivered at most (delay-count; None: no limit)
    _walk: _Walk | None = field(default=None, init=False, compare=False, repr=False)  # cron only

    @classmethod
    def of(
        cls,
        *,
        cron: str | None,
        every_ms: int | None,
        zone: str | None,
        start_ms: int,
        until_ms: int | None = None,
        missed: str | None = None,
        missed_after_ms: int | None = None,
        count: int | None = None,
    ) -> Recurrence:
        """A checked schedule: raises :class:`BadSchedule` naming what is wrong — neither or both
        of cron and every, a bad expression or zone, too short an interval, an unknown missed
        policy, or a schedule with no occurrence at all."""
        if (cron is None) == (every_ms is None):
            raise BadSchedule("exactly one of delay-cron and delay-every is needed")
        try:
            policy = Missed(missed or Missed.LATEST)
        except ValueError:
            raise BadSchedule(f"delay-missed: {missed!r} is none of latest, all, skip") from None
        name = zone or "UTC"
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadSchedule(f"delay-timezone: {name!r} is no IANA time zone") from None
        expression = ""
        if cron is not None:
            expression = MACROS.get(cron.strip().lower(), _SPACES.sub(" ", cron.strip()))
            problem = _cron_problem(expression)
            if problem:
                raise BadSchedule(f"delay-cron: {cron!r}: {problem}")
        elif every_ms is not None and every_ms < MIN_EVERY_MS:
            raise BadSchedule(f"delay-every: {every_ms} ms is shorter than a second")
        made = cls(
            expression,
            every_ms or 0,
            name,
            start_ms,
            until_ms,
            policy,
            MISSED_AFTER_MS if missed_after_ms is None else missed_after_ms,
            count,
        )
        if made.first() is None:
            raise BadSchedule("no occurrence falls between its start and delay-until")
        return made

    def first(self) -> int | None:
        """The first occurrence (epoch ms; None: there is none)."""
        if self.every_ms:
            return self.after(self.start_ms - 1)
        # A cron schedule's is a CronSim walk (~25 µs), found once per schedule read: its check,
        # the ingest's due time and the egress's step each ask.
        walk = self._walker()
        if walk.first is _UNKNOWN:
            walk.first = self.after(self.start_ms - 1)
        return cast("int | None", walk.first)

    def after(self, ms: int) -> int | None:
        """The first occurrence after ``ms`` (epoch ms), None when none is left."""
        if self.every_ms:
            k = 0 if ms < self.start_ms else (ms - self.start_ms) // self.every_ms + 1
            found: int | None = self.start_ms + k * self.every_ms
        else:
            found = self._cron_after(max(ms, self.start_ms - 1))
        if found is None or (self.until_ms is not None and found > self.until_ms):
            return None
        return found

    def latest_by(self, ms: int) -> int | None:
        """The last occurrence at or before ``ms`` (None: none is)."""
        if self.until_ms is not None:
            ms = min(ms, self.until_ms)
        if ms < self.start_ms:
            return None
        if self.every_ms:
            return self.start_ms + (ms - self.start_ms) // self.every_ms * self.every_ms
        found = self._cron_before(ms + 1)
        return found if found is not None and found >= self.start_ms else None

    def upcoming(self, ms: int, n: int) -> list[int]:
        """The next ``n`` occurrences after ``ms`` (fewer when the schedule ends)."""
        found: list[int] = []
        at: int | None = ms
        while len(found) < n and at is not None:
            at = self.after(at)
            if at is not None:
                found.append(at)
        return found

    def fire(self, occurrence_ms: int, now_ms: int) -> Fire:
        """What to deliver of ``occurrence_ms``, the bridge getting to it at ``now_ms`` (see the
        module's docstring: missed occurrences)."""
        if now_ms - occurrence_ms <= self.missed_after_ms or self.missed is Missed.ALL:
            return Fire(occurrence_ms, 0, self.after(occurrence_ms))
        latest = self.latest_by(now_ms)
        assert latest is not None  # occurrence_ms is one, and at or before now_ms
        skipped = self._count_between(occurrence_ms, latest)
        if self.missed is Missed.SKIP and now_ms - latest > self.missed_after_ms:
            return Fire(None, skipped + 1, self.after(latest))
        return Fire(latest, skipped, self.after(latest))

    def local(self, ms: int) -> datetime:
        """``ms`` as a time in the schedule's zone."""
        return datetime.fromtimestamp(ms / 1000, ZoneInfo(self.zone))

    def _count_between(self, first_ms: int, last_ms: int) -> int:
        """Occurrences from ``first_ms`` up to, not including, ``last_ms`` (both occurrences)."""
        if self.every_ms:
            return (last_ms - first_ms) // self.every_ms
        count, at = 0, first_ms
        while at < last_ms and count < MAX_STEPS:
            count += 1
            nxt = self.after(at)
            if nxt is None:
                break
            at = nxt
        return count

    def _walker(self) -> _Walk:
        walk = self._walk
        if walk is None:  # made on first use: an interval's schedule has none
            walk = _Walk()
            object.__setattr__(self, "_walk", walk)  # frozen: its fields, not this state
        return walk

    def _cron_after(self, ms: int) -> int | None:
        walk = self._walker()
        times = walk.times
        if times is None or walk.at != ms:  # cronsim yields whole minutes after the moment given
            times = CronSim(self.cron, datetime.fromtimestamp(ms / 1000, ZoneInfo(self.zone)))
        walk.times = None
        for _ in range(MAX_STEPS):
            try:
                when = next(times)
            except StopIteration:
                return None
            # Walked from a moment in the hour a fall-back repeats, cronsim starts at its first
            # pass: what it gives before the moment asked is not after it.
            if not _repeated(when) and _epoch_ms(when) > ms:
                walk.at, walk.times = _epoch_ms(when), times
                return walk.at
        return None

    def _cron_before(self, ms: int) -> int | None:
        zone = ZoneInfo(self.zone)
        times = CronSim(self.cron, datetime.fromtimestamp(ms / 1000, zone), reverse=True)
        for _ in range(MAX_STEPS):
            try:
                when = next(times)
            except StopIteration:
                return None
            if _epoch_ms(when) < ms and not _repeated(when):
                return _epoch_ms(when)
        return None


@functools.lru_cache(maxsize=4096)
def _cron_problem(expression: str) -> str:
    """What is wrong with a cron ``expression`` ("": nothing). A schedule is read at its ingest
    and again at each occurrence, and CronSim's parse is most of a check (14 µs): the answer
    depends on the expression alone, and schedules share a few, so it is kept per expression."""
    try:
        CronSim(expression, datetime.now(UTC))
    except CronSimError as exc:
        return str(exc) or type(exc).__name__
    return ""


def recurrence_of(
    texts: Mapping[str, str], base_ms: int, missed_after_ms: int | None = None
) -> Recurrence:
    """The schedule a record's headers describe: ``texts`` holds its control headers' texts
    (``delay-cron`` or ``delay-every``, and ``delay-id``, ``delay-timezone``, the due-time headers
    for its start — else ``base_ms``, the record's timestamp — ``delay-until``, ``delay-count``,
    ``delay-missed``); ``missed_after_ms``: its ``delay-max-lateness``. Raises
    :class:`BadSchedule` naming the header at fault."""
    if (H_CRON in texts) == (H_EVERY in texts):
        raise BadSchedule(f"exactly one of {H_CRON} and {H_EVERY} is needed")
    delay_id = texts.get(H_ID)
    if delay_id is None or not 1 <= len(delay_id.encode()) <= MAX_ID_BYTES:
        raise BadSchedule(
            f"{H_ID}: a recurring schedule needs one of 1 to {MAX_ID_BYTES} bytes (its identity: "
            "cancels, pauses and replacements name it)"
        )
    every_ms = None
    if H_EVERY in texts:
        every_ms = _read(H_EVERY, parse_duration_ms, texts[H_EVERY])
    if H_DELIVER_AT in texts and H_AFTER in texts:
        raise BadSchedule(f"both {H_DELIVER_AT} and {H_AFTER} are set: the first occurrence is one")
    start_ms = base_ms
    if H_DELIVER_AT in texts:
        start_ms = _read(H_DELIVER_AT, parse_time_ms, texts[H_DELIVER_AT])
    elif H_AFTER in texts:
        start_ms = base_ms + _read(H_AFTER, parse_duration_ms, texts[H_AFTER])
    until_ms = None
    if H_UNTIL in texts:
        until_ms = _read(H_UNTIL, parse_time_ms, texts[H_UNTIL])
    count = None
    if H_COUNT in texts:
        count = parse_count(texts[H_COUNT].strip())
        if not count:
            raise BadSchedule(f"{H_COUNT}: a positive integer, not {texts[H_COUNT][:40]!r}")
    return Recurrence.of(
        cron=texts.get(H_CRON),
        every_ms=every_ms,
        zone=texts.get(H_TIMEZONE),
        start_ms=start_ms,
        until_ms=until_ms,
        missed=texts.get(H_MISSED),
        missed_after_ms=missed_after_ms,
        count=count,
    )


def _read(name: str, reader: Callable[[str], int], text: str) -> int:
    """``reader(text)``; its refusal as a BadSchedule naming the header ``name``."""
    try:
        return reader(text)
    except ValueError as exc:
        raise BadSchedule(f"{name}: {exc}") from None


def _repeated(when: datetime) -> bool:
    """Whether ``when`` is the second occurrence of a local time a fall-back repeats."""
    if not when.fold:
        return False
    return when.replace(fold=0).utcoffset() != when.utcoffset()


_EPOCH, _MS = datetime(1970, 1, 1, tzinfo=UTC), timedelta(milliseconds=1)


def _epoch_ms(when: datetime) -> int:
    return (when - _EPOCH) // _MS  # exact: cronsim's times are whole seconds
