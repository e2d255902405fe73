"""The header contract: header names, DLQ reasons, and the records it yields.

The control headers come in on a delay-topic record; :class:`Scheduled` gives the delivered
record's shape, :func:`dead_letter_headers` the DLQ's. Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import cast

from bridge.message.values import parse_duration_ms

Headers = list[tuple[str, bytes | None]]
WireHeaders = list[tuple[str, str | bytes | None]]


def wire_headers(headers: Headers) -> WireHeaders:
    """The same list, typed as the Kafka client's ``produce`` takes it."""
    return cast(WireHeaders, headers)


H_TARGET_TOPIC = "delay-target-topic"
H_DELIVER_AT = "delay-deliver-at"
H_AFTER = "delay-after"
H_TARGET_KEY = "delay-target-key"
H_ID = "delay-id"
H_CANCEL = "delay-cancel"
H_PRIORITY = "delay-priority"
H_MAX_LATENESS = "delay-max-lateness"
H_DUE_AT = "delay-due-at"
H_ERROR = "delay-error"
H_ERROR_DETAIL = "delay-error-detail"
H_ORIGIN = "delay-origin"
# The bulk operation (the command line's cancel, fire or reschedule with a filter) that produced a
# record: run again or resumed, the operation passes over a record that carries its own id.
H_OPERATION = "delay-operation"
# The origin (<topic>:<partition>:<offset>) of the record a record replaces exactly: that record
# only, and nothing when it no longer waits — the command line's fire and reschedule name theirs,
# so one that reaches its record after it was claimed or delivered delivers nothing twice.
H_REPLACES = "delay-replaces"

# A recurring schedule (cron or an interval) and the records that pause and resume one (the
# contract's "Recurring schedules", bridge.message.recurrence).
H_CRON = "delay-cron"
H_EVERY = "delay-every"
H_PAUSE = "delay-pause"
H_RESUME = "delay-resume"
RECURRING_HEADERS = (H_CRON, H_EVERY, H_PAUSE, H_RESUME)
# What else a recurring schedule may say (bridge.message.recurrence): its zone, its end, how many
# occurrences at most, and what becomes of occurrences missed in an outage.
H_TIMEZONE = "delay-timezone"
H_UNTIL = "delay-until"
H_COUNT = "delay-count"
H_MISSED = "delay-missed"
# Set by the bridge on the record that carries a schedule on to its next occurrence: the offset of
# the record it continues, in the same partition (see bridge.egress.recurring).
H_CONTINUES = "delay-continues"
# ... and, when the schedule was paused as it was carried on: what a registry that has no word of
# the schedule (a Redis that lost its data) goes by until a pause or a resume is read again.
H_PAUSED = "delay-paused"
# ... or, on the record the bridge writes when a schedule's last occurrence is delivered (its count
# or its end reached): the schedule ends at the record it continues (the registry forgets it).
H_ENDED = "delay-ended"
# Set by the bridge on a producer's schedule as it stores it, and kept on every record carrying it
# on: the producer's timestamp (epoch ms). A cancel read in another partition ends the schedule if
# stamped no earlier than this, however recently the schedule was carried on.
H_PRODUCED = "delay-produced-at"
SCHEDULE_HEADERS = (
    H_TIMEZONE,
    H_UNTIL,
    H_COUNT,
    H_MISSED,
    H_CONTINUES,
    H_PAUSED,
    H_ENDED,
    H_PRODUCED,
)
# Set by the bridge on each occurrence it delivers: the instant it was scheduled for (epoch ms).
H_OCCURRENCE = "delay-occurrence"
# A record with any of these is about a recurring schedule (a bad-schedule if it is not one).
SCHEDULING = frozenset((*RECURRING_HEADERS, *SCHEDULE_HEADERS))

CONTROL_HEADERS = frozenset(
    {
        H_TARGET_TOPIC,
        H_DELIVER_AT,
        H_AFTER,
        H_TARGET_KEY,
        H_ID,
        H_CANCEL,
        H_PRIORITY,
        H_MAX_LATENESS,
        *RECURRING_HEADERS,
        *SCHEDULE_HEADERS,
    }
)
# Stripped from a delivered record: the control headers, and the ones the bridge sets itself,
# so a record that passes through the bridge twice never carries a stale due time.
STRIPPED_ON_DELIVERY = CONTROL_HEADERS | {H_DUE_AT, H_OPERATION, H_REPLACES, H_OCCURRENCE}
MAX_ID_BYTES = 256
# The header sets a delay topic may speak (topics.dialect): this contract's, that of
# etf1/kafka-message-scheduler and that of Kaspr's scheduler (see bridge.dialects).
DIALECTS = ("delay-bridge", "etf1", "kaspr")


class Priority(IntEnum):
    """``delay-priority``: among records that are due, a lower value is claimed first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @property
    def label(self) -> str:
        """The header's value, and the metrics' ``priority`` label."""
        return self.name.lower()

    @classmethod
    def of(cls, text: str) -> Priority:
        """The priority a header value names; ValueError for any other text."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                f"{H_PRIORITY} must be one of {', '.join(p.label for p in cls)}, not {text!r}"
            ) from None


class Reason(StrEnum):
    """DLQ reason codes (the ``delay-error`` header)."""

    MISSING_DUE_TIME = "missing-due-time"
    CONFLICTING_DUE_TIME = "conflicting-due-time"
    BAD_DUE_TIME = "bad-due-time"
    DELAY_TOO_LONG = "delay-too-long"
    MISSING_TARGET = "missing-target"
    TARGET_NOT_ALLOWED = "target-not-allowed"
    TOO_LARGE = "too-large"
    BAD_HEADER = "bad-header"
    DELIVERY_FAILED = "delivery-failed"
    PAYLOAD_MISSING = "payload-missing"
    EXPIRED = "expired"
    BAD_SCHEDULE = "bad-schedule"
    QUOTA_EXCEEDED = "quota-exceeded"


class Rejected(Exception):
    """A delay-topic record that cannot be scheduled: goes to the DLQ with ``reason``."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class Scheduled:
    """A delay-topic record accepted for delivery, as it is stored in Redis.

    ``key`` and ``headers`` are the record's own, so a record that later fails delivery reaches
    the DLQ as it came in; :meth:`delivered_key` and :meth:`delivered_headers` give the shape
    the target topic sees. Treat it as immutable: it is not frozen only because it is built
    twice per record (parsed, then decoded) and a frozen dataclass's ``__init__`` costs four
    times as much (~0.9 µs against ~0.2 µs for its nine fields).
    """

    offset: int
    due_ms: int
    target: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    delay_id: str
    # When the bridge stored a record that was already due (epoch ms), else None: lateness counts
    # from the later of the due time and this, so it measures the bridge, not a late producer.
    stored_ms: int | None = None
    # The delay-topic partition whose default delay-id ``delay_id`` is, when the parser or the
    # stored encoding says so: spares building the origin per record to compare. None says
    # nothing.
    default_of: tuple[str, int] | None = field(default=None, compare=False)
    priority: Priority = Priority.NORMAL
    # The record's own timestamp (its read time when it has none): a cancel or replacement read
    # in another partition withdraws it only if stamped no earlier. Not kept in Redis's encoding
    # (the id index keeps it for records with a caller-given id).
    timestamp_ms: int = field(default=0, compare=False)
    # A recurring schedule (delay-cron or delay-every): each time it falls due, the egress
    # delivers an occurrence and carries it on to the next (bridge.egress.recurring).
    recurring: bool = field(default=False, compare=False)
    # The offset of the record of the same partition this one carries on from (its delay-continues
    # header, set by the bridge), None for one a producer wrote: the store takes it only while the
    # schedule is still that record's (add.lua's schedule registry).
    continues: int | None = field(default=None, compare=False)

    def given_id(self, topic: str, partition: int) -> str | None:
        """The delay-id its producer gave; None when it is the default one (the origin)."""
        home = self.default_of
        if home is not None and home[1] == partition and home[0] == topic:
            return None
        return None if self.delay_id == origin(topic, partition, self.offset) else self.delay_id

    def carried_on_paused(self) -> bool:
        """Whether the bridge carried its schedule on while the schedule was paused (its
        ``delay-paused`` on a record that continues another)."""
        return self.continues is not None and any(k == H_PAUSED for k, _ in self.headers)

    @property
    def dead_letter(self) -> bool:
        """Whether it goes to the DLQ at its due time (see :func:`dead_letter_when_due`): its
        headers are the DLQ's already."""
        return not self.target

    def produced_ms(self) -> int:
        """When its producer produced it: a recurring schedule's ``delay-produced-at`` (the
        producer's record's, kept as the bridge carries it on), else its own timestamp."""
        if self.recurring:
            for name, value in self.headers:
                if name == H_PRODUCED and value and value.isdigit():
                    return int(value)
        return self.timestamp_ms

    def late_from_ms(self) -> int:
        """The moment from which a delivery counts as late."""
        return max(self.due_ms, self.stored_ms or self.due_ms)

    def expires_ms(self, default_ms: int) -> int | None:
        """Past when (epoch ms) it is no longer delivered but dead-lettered as ``expired``: its
        due time + its ``delay-max-lateness``, else + ``default_ms`` (``egress.max_lateness``);
        None when that is 0: it never expires."""
        limit = default_ms
        for name, value in self.headers:
            if name == H_MAX_LATENESS:
                with contextlib.suppress(UnicodeDecodeError, ValueError):  # refused when read
                    limit = parse_duration_ms((value or b"").decode())
                break
        return self.due_ms + limit if limit > 0 else None

    def delivered_key(self) -> bytes | None:
        """``delay-target-key`` when the record has one (a null one: a null key), else its own
        key."""
        for name, value in self.headers:
            if name == H_TARGET_KEY:
                return value
        return self.key

    def delivered_headers(self) -> Headers:
        """The headers of the delivered record: originals without control headers, plus ours."""
        kept = [(k, v) for k, v in self.headers if k not in STRIPPED_ON_DELIVERY]
        kept.append((H_ID, self.delay_id.encode()))
        kept.append((H_DUE_AT, str(self.due_ms).encode()))
        return kept


@dataclass(frozen=True)
class Cancel:
    """A delay-topic record that withdraws the waiting record with ``delay_id`` from its delay
    topic (stamped no later than ``timestamp_ms`` when it waits in another partition): stored
    nowhere, delivered nowhere. ``due_ms``, from its ``delay-due-at``: the due time of the
    record it cancels, as the command line gives it — a hint that finds a record named by its
    default delay-id without a scan, checked, never trusted (None: none given). A record with
    several ``delay-cancel`` headers cancels each: ``more`` holds the delay-ids and hints after
    the first, in header order (:meth:`each` gives a cancel per id, all at the record's offset)."""

    offset: int
    delay_id: str
    timestamp_ms: int = field(default=0, compare=False)
    due_ms: int | None = field(default=None, compare=False)
    more: tuple[tuple[str, int | None], ...] = field(default=(), compare=False)
    # Not a cancel but a pause (True) or a resume (False) of the recurring schedule with
    # ``delay_id`` (``delay-pause``, ``delay-resume``): it withdraws nothing.
    hold: bool | None = field(default=None, compare=False)
    # Not a cancel but the end of the schedule with ``delay_id`` at the record at this offset
    # (``delay-ended``, written by the bridge with its last occurrence): it withdraws nothing.
    ends: int | None = field(default=None, compare=False)
    # Not a cancel but a schedule's record with this delay-id that a re-read left out, its step
    # delivered (the journal says so: bridge.ingress.settled): the schedule is at this record,
    # and the record carrying it on (or ending it) follows. True: it was carried on paused. It
    # withdraws nothing.
    left_out: bool | None = field(default=None, compare=False)
    # Not a cancel but a schedule's record with this delay-id that a re-read left out, cancelled
    # (the journal says so): the schedule went no further, and ends here if the registry has it
    # at an earlier record. It withdraws nothing.
    left_withdrawn: bool = field(default=False, compare=False)
    # A record a re-read left out (the journal holds its fate) that replaced exactly
    # (``delay-replaces``) the record this default delay-id names: a cancel of that record,
    # journaled as replaced, for it left because of this one (bridge.ingress.settled).
    replaces: bool = field(default=False, compare=False)

    def each(self) -> list[Cancel]:
        """One cancel per delay-id the record names, in its order."""
        first = Cancel(self.offset, self.delay_id, self.timestamp_ms, self.due_ms)
        return [first] + [Cancel(self.offset, i, self.timestamp_ms, d) for i, d in self.more]


def origin(topic: str, partition: int, offset: int) -> str:
    """``<topic>:<partition>:<offset>``: the default delay-id and the DLQ ``delay-origin``."""
    return f"{topic}:{partition}:{offset}"


def record_size(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> int:
    """Bytes of key + value + header names and values, as ``limits.max_record_bytes`` counts."""
    size = len(key or b"") + len(value or b"")
    for name, hvalue in headers:
        size += len(name) + len(hvalue or b"")
    return size


def dead_letter_when_due(
    topic: str,
    partition: int,
    offset: int,
    due_ms: int,
    *,
    reason: Reason,
    detail: str,
    message: tuple[bytes | None, bytes | None, Headers] = (None, None, []),
) -> Scheduled:
    """A record that reaches the DLQ at its due time instead of its target: a far-future record
    whose payload was gone from the delay topic when it was read back (no key or value), or that
    the rules refuse by then (``message``: its key, value and headers). No target marks it."""
    key, value, headers = message
    where = origin(topic, partition, offset)
    return Scheduled(
        offset,
        due_ms,
        "",
        key,
        value,
        dead_letter_headers(headers, reason, detail, where),
        where,
        default_of=(topic, partition),
    )


def dead_letter_reason(headers: Headers) -> str:
    """The ``delay-error`` of a record's DLQ headers ("" when it has none)."""
    for name, value in reversed(headers):
        if name == H_ERROR:
            return (value or b"").decode(errors="replace")
    return ""


def without_value(detail: str, value_bytes: int, where: str) -> str:
    """A DLQ copy's detail when its value is left out (the whole copy is larger than the DLQ
    takes)."""
    return (
        f"{detail} (value of {value_bytes} bytes left out: the whole copy is larger than the DLQ "
        f"takes; it stays at {where})"
    )


def stub_detail(detail: str, record_bytes: int, where: str) -> str:
    """A DLQ stub's detail: the copy is only the ``delay-error*`` headers and ``delay-origin``,
    since even without its value it is larger than the DLQ takes."""
    short = detail if len(detail) <= 200 else detail[:199] + "\u2026"
    return (
        f"{short} (a stub: the record of {record_bytes} bytes, key, value and headers, is larger "
        f"than the DLQ takes even without its value; it stays at {where})"
    )


def dead_letter_headers(headers: Headers, reason: Reason, detail: str, origin_text: str) -> Headers:
    """Original headers plus ``delay-error``, ``delay-error-detail`` and ``delay-origin``."""
    one_line = " ".join(detail.split())[:1000]
    return [
        *headers,
        (H_ERROR, reason.value.encode()),
        (H_ERROR_DETAIL, one_line.encode()),
        (H_ORIGIN, origin_text.encode()),
    ]
